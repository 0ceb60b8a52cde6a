// The host buffer cache: a freed output is handed to the next request that fits, its stale
// contents never show through, the limit bounds what is kept, and 0 turns it off.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>

#include "cpkit/optimized/host_cache.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "host_cache_internal.hpp"

namespace cpkit {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// [1, 64, 8192] float32 logits: the CE gradient is exactly 2 MiB.
at::Tensor ce_gradient(int seed) {
  at::manual_seed(seed);
  const at::Tensor logits = at::randn({1, 64, 8192}).requires_grad_(true);
  const at::Tensor labels = at::randint(0, 8192, {1, 64}, at::kLong);
  const at::Tensor loss = shifted_cp_loss(logits, labels, at::ones({64}, at::kBool), nullptr);
  return torch::autograd::grad({loss}, {logits})[0];
}

class HostCache : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_limit_ = host_cache_stats().limit_bytes;  // 0 in sanitizer builds
    set_host_cache_limit(64 * kMiB);
    release_host_cache();
  }
  void TearDown() override { set_host_cache_limit(previous_limit_); }

 private:
  std::size_t previous_limit_ = 0;
};

TEST_F(HostCache, ReusesAFreedGradientForTheNextStep) {
  at::Tensor first = ce_gradient(1);
  const at::Tensor first_copy = first.clone();
  const void* first_data = first.data_ptr();
  first = at::Tensor();  // the step ends: the gradient is freed into the cache
  EXPECT_EQ(host_cache_stats().cached_bytes, 2 * kMiB);

  const HostCacheStats before = host_cache_stats();
  const at::Tensor second = ce_gradient(1);
  EXPECT_EQ(host_cache_stats().hits, before.hits + 1);
  EXPECT_EQ(host_cache_stats().misses, before.misses);
  EXPECT_EQ(second.data_ptr(), first_data);
  EXPECT_TRUE(at::equal(second, first_copy)) << "a reused buffer changed the gradient";
}

TEST_F(HostCache, StaleContentsNeverShowThroughAShard) {
  // Poison a 2 MiB block, then shard into exactly that size: [2, 256, 1024] float32 on rank
  // 1 of CP = 2, S = 511, so the shard's last position is padding that must be written.
  {
    at::Tensor poisoned = ce_gradient(2);
    poisoned.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  CPBatch batch;
  batch.inputs_embeds = at::randn({2, 511, 1024});
  batch.labels = at::randint(0, 100, {2, 511}, at::kLong);
  const HostCacheStats before = host_cache_stats();
  const LocalShard local = prepare_cp_inputs_for(batch, 2).local(0, 1);
  EXPECT_EQ(host_cache_stats().hits, before.hits + 1) << "the shard did not take the block";
  const at::Tensor expected =
      at::constant_pad_nd(batch.inputs_embeds, {0, 0, 0, 1}).narrow(1, 256, 256);
  EXPECT_TRUE(at::equal(local.inputs_embeds, expected));
  EXPECT_FALSE(local.inputs_embeds.isnan().any().item<bool>());
}

TEST_F(HostCache, KeepsAtMostTheLimitDroppingTheOldestFirst) {
  set_host_cache_limit(3 * kMiB);
  at::Tensor a = ce_gradient(3), b = ce_gradient(4);
  const void* b_data = b.data_ptr();
  a = at::Tensor();
  b = at::Tensor();  // b is kept, a (freed first) is dropped
  EXPECT_EQ(host_cache_stats().cached_bytes, 2 * kMiB);
  EXPECT_EQ(ce_gradient(5).data_ptr(), b_data);
}

// Storage straight from the cache (the internal entry every output uses): `bytes` of uint8.
at::Tensor block_of(std::size_t bytes) {
  return detail::empty_reusable({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
}

// Three blocks of different sizes freed in turn under a limit that keeps two: the first
// freed goes; the two later ones come back to requests of their sizes, the first's misses.
TEST_F(HostCache, EvictsInTheOrderBlocksWereFreed) {
  set_host_cache_limit(5 * kMiB);
  at::Tensor a = block_of(3 * kMiB), b = block_of(2 * kMiB), c = block_of(kMiB + kMiB / 2);
  const void* b_data = b.data_ptr();
  const void* c_data = c.data_ptr();
  a = at::Tensor();  // freed first
  b = at::Tensor();
  c = at::Tensor();  // 3 + 2 + 1.5 MiB > 5 MiB: a goes
  EXPECT_EQ(host_cache_stats().cached_bytes, 2 * kMiB + kMiB + kMiB / 2);
  const HostCacheStats before = host_cache_stats();
  const at::Tensor c_again = block_of(kMiB + kMiB / 2), b_again = block_of(2 * kMiB);
  EXPECT_EQ(c_again.data_ptr(), c_data);
  EXPECT_EQ(b_again.data_ptr(), b_data);
  EXPECT_EQ(host_cache_stats().hits, before.hits + 2);
  const at::Tensor a_again = block_of(3 * kMiB);
  EXPECT_EQ(host_cache_stats().misses, before.misses + 1) << "the first freed was kept";
}

// Blocks are whole 64 KiB granules, and a cached block serves a request that needs at most
// 1/8 less than it holds, never one that needs more or far less.
TEST_F(HostCache, RoundsToGranulesAndReusesOnlyCloseFits) {
  constexpr std::size_t kGranule = 64 << 10;
  const void* data = nullptr;
  {
    const at::Tensor t = block_of(kMiB + 1);
    data = t.data_ptr();
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, kMiB + kGranule) << "one byte over rounds up";
  auto reused = [&](std::size_t bytes) {
    const HostCacheStats before = host_cache_stats();
    const at::Tensor t = block_of(bytes);
    const bool hit = host_cache_stats().hits == before.hits + 1;
    EXPECT_EQ(hit, t.data_ptr() == data) << bytes << " bytes";
    return hit;
  };
  EXPECT_TRUE(reused(kMiB + kGranule));  // exactly the block
  EXPECT_TRUE(reused(kMiB));             // 1/16 smaller
  EXPECT_FALSE(reused(kMiB + kGranule + 1)) << "a block too small was handed out";
  release_host_cache();
  {
    const at::Tensor t = block_of(2 * kMiB);
    data = t.data_ptr();
  }
  EXPECT_TRUE(reused(2 * kMiB - 2 * kGranule));   // 2 MiB is 1/15 larger: fits
  EXPECT_FALSE(reused(2 * kMiB - 4 * kGranule));  // 2 MiB is 1/7 larger: a new block
}

TEST_F(HostCache, LimitZeroTurnsItOffAndFreesWhatIsCached) {
  { const at::Tensor g = ce_gradient(6); }
  EXPECT_EQ(host_cache_stats().cached_bytes, 2 * kMiB);
  set_host_cache_limit(0);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  const HostCacheStats before = host_cache_stats();
  { const at::Tensor g = ce_gradient(6); }
  EXPECT_EQ(host_cache_stats().hits, before.hits);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
}

TEST_F(HostCache, SmallOutputsBypassIt) {
  const HostCacheStats before = host_cache_stats();
  CPBatch batch;
  batch.inputs_embeds = at::randn({2, 64, 16});  // 8 KiB shards
  batch.labels = at::randint(0, 100, {2, 64}, at::kLong);
  const LocalShard local = prepare_cp_inputs_for(batch, 2).local(0, 1);
  EXPECT_TRUE(at::equal(local.inputs_embeds, batch.inputs_embeds.narrow(1, 32, 32)));
  EXPECT_EQ(host_cache_stats().hits + host_cache_stats().misses, before.hits + before.misses);
}

}  // namespace
}  // namespace cpkit
