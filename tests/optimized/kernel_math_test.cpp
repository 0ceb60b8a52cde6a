// The arithmetic the CPU and CUDA cross-entropy kernels share (kernels/cross_entropy.hpp),
// run on the CPU: fast_exp, the online softmax and the merge of split-row statistics that
// the CUDA kernel's threads and warps (and the CPU kernel's blocks) rely on, masked logits
// (-inf) that must weigh nothing and never give NaN; then masked vocabularies end to end.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpkit/optimized/loss.hpp"
#include "kernels/cluster_plan.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/upstream_scale.hpp"

namespace cpkit::kernels {
namespace {

TEST(KernelMath, FastExpMatchesExpAndUnderflowsToZero) {
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(fast_exp(x), want, 4e-7 * want) << "x = " << x;
  }
  EXPECT_EQ(fast_exp(-87.5f), 0.0f);
  EXPECT_EQ(fast_exp(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(fast_exp(NAN)));
}

OnlineSoftmax one_pass(const std::vector<float>& x, std::size_t begin, std::size_t end) {
  OnlineSoftmax s = online_empty();
  for (std::size_t i = begin; i < end; ++i) online_add(s, x[i]);
  return s;
}

TEST(KernelMath, MaskedLogitsWeighNothing) {
  const OnlineSoftmax with = one_pass({1.0f, -INFINITY, 2.0f, -INFINITY}, 0, 4);
  const OnlineSoftmax without = one_pass({1.0f, 2.0f}, 0, 2);
  EXPECT_EQ(with.max, without.max);
  EXPECT_FLOAT_EQ(with.sum, without.sum);
  // A part of a row that holds masked logits only: max -inf, sum 0, no NaN; merging it is
  // the identity on either side.
  const OnlineSoftmax masked = one_pass({-INFINITY, -INFINITY}, 0, 2);
  EXPECT_EQ(masked.max, -INFINITY);
  EXPECT_EQ(masked.sum, 0.0f);
  EXPECT_EQ(online_merge(masked, without).sum, without.sum);
  EXPECT_EQ(online_merge(without, masked).sum, without.sum);
  EXPECT_EQ(finite_shift(-INFINITY), 0.0f);
  EXPECT_EQ(fast_exp(-INFINITY - finite_shift(-INFINITY)), 0.0f);
  // Its gradient is exactly 0, with and without the cap (tanh(-inf) = -1 is finite).
  EXPECT_EQ(cross_entropy_grad(-INFINITY, false, 2.0f, 0.3f, 0.0f, 0.5f), 0.0f);
  EXPECT_EQ(cross_entropy_grad(-INFINITY, false, 2.0f, 0.3f, 5.0f, 0.5f), 0.0f);
}

// Any split of a row into parts (threads, warps, blocks, cluster ranks), each reduced by its
// own online softmax and merged in any tree, gives the one-pass statistics.
TEST(KernelMath, SplitRowStatisticsMergeToOnePass) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t V = 1 + rng() % 3000;
    std::vector<float> x(V);
    for (float& v : x) v = rng() % 5 == 0 ? -INFINITY : normal(rng);
    x[rng() % V] = normal(rng);  // at least one unmasked logit
    std::vector<std::size_t> cuts{0, V};
    for (int c = 0; c < 6; ++c) cuts.push_back(rng() % (V + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<OnlineSoftmax> parts;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
      parts.push_back(one_pass(x, cuts[i], cuts[i + 1]));
    while (parts.size() > 1) {  // pairwise, like a warp shuffle tree
      std::vector<OnlineSoftmax> next;
      for (std::size_t i = 0; i < parts.size(); i += 2)
        next.push_back(i + 1 < parts.size() ? online_merge(parts[i], parts[i + 1]) : parts[i]);
      parts = next;
    }
    const OnlineSoftmax whole = one_pass(x, 0, V);
    EXPECT_EQ(parts[0].max, whole.max) << "trial " << trial;
    EXPECT_NEAR(parts[0].sum, whole.sum, 2e-6 * whole.sum) << "trial " << trial;
    ASSERT_TRUE(std::isfinite(parts[0].sum)) << "trial " << trial;
  }
}

// The CUDA kernels' per-float4 update equals four single updates: same max, the same sum up
// to rounding, masked logits weighing nothing, an all-masked quad leaving the state as is.
TEST(KernelMath, QuadUpdateEqualsFourSingleUpdates) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t quads = 1 + rng() % 700;
    std::vector<float> x(4 * quads);
    for (float& v : x) v = rng() % 4 == 0 ? -INFINITY : normal(rng);
    OnlineSoftmax four = online_empty();
    for (std::size_t q = 0; q < quads; ++q)
      online_add4(four, x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
    const OnlineSoftmax single = one_pass(x, 0, x.size());
    EXPECT_EQ(four.max, single.max) << "trial " << trial;
    EXPECT_NEAR(four.sum, single.sum, 2e-6 * single.sum) << "trial " << trial;
    ASSERT_FALSE(std::isnan(four.sum)) << "trial " << trial;
  }
  OnlineSoftmax s = online_empty();
  online_add4(s, -INFINITY, -INFINITY, -INFINITY, -INFINITY);
  EXPECT_EQ(s.max, -INFINITY);
  EXPECT_EQ(s.sum, 0.0f);
  online_add4(s, 1.0f, -INFINITY, -INFINITY, -INFINITY);
  EXPECT_EQ(s.max, 1.0f);
  EXPECT_EQ(s.sum, 1.0f);
}

// The CUDA kernel's split of a row into a scalar head, aligned float4s and a scalar tail,
// for every row start a float can have and vocabularies that are not multiples of 4.
TEST(KernelMath, VectorSpanCoversTheRowWithAlignedQuads) {
  for (std::uintptr_t address = 4096; address < 4096 + 64; address += 4)
    for (const std::int64_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 50257, 131072, 151936}) {
      const VectorSpan span = vector_span(address, n);
      EXPECT_EQ(span.head + 4 * span.quads + span.tail, n) << address << " " << n;
      EXPECT_GE(span.head, 0);
      EXPECT_LT(span.head, 4);
      EXPECT_GE(span.tail, 0);
      EXPECT_LT(span.tail, 4);
      if (span.quads > 0) {
        EXPECT_EQ((address + 4 * span.head) % 16, 0u) << address << " " << n;
      }
      if (n >= 7) {
        EXPECT_GT(span.quads, 0) << address << " " << n;
      }
    }
}

// Masked vocabularies end to end on the CPU kernel (whole 512-logit blocks masked too): the
// loss and gradient of PyTorch's cross_entropy on the same logits, never NaN.
TEST(KernelMath, MaskedVocabularyMatchesTorch) {
  for (const double softcap : {0.0, 20.0}) {
    at::manual_seed(3);
    const int64_t T = 6, V = 1500;
    at::Tensor logits = at::randn({1, T, V}) * 3;
    logits.narrow(2, 512, 512).fill_(-INFINITY);                // a whole block
    logits.masked_fill_(at::rand({1, T, V}) < 0.3, -INFINITY);  // and scattered entries
    logits.select(2, 0).fill_(1.0f);  // every target is class 0, never masked
    const at::Tensor labels = at::zeros({1, T}, at::kLong);
    const at::Tensor valid = at::ones({T}, at::kBool);
    const at::Tensor x = logits.clone().requires_grad_(true);
    const at::Tensor loss = cpkit::shifted_cp_loss(x, labels, valid, nullptr, {.softcap = softcap});
    loss.backward();
    const at::Tensor y = logits.clone().requires_grad_(true);
    at::Tensor z = y.narrow(1, 0, T - 1).reshape({-1, V});
    if (softcap > 0) z = softcap * at::tanh(z / softcap);
    const at::Tensor truth = at::cross_entropy_loss(z, labels.narrow(1, 1, T - 1).reshape({-1}));
    truth.backward();
    ASSERT_TRUE(std::isfinite(loss.item<float>())) << "softcap " << softcap;
    EXPECT_NEAR(loss.item<float>(), truth.item<float>(), 1e-5) << "softcap " << softcap;
    EXPECT_FALSE(x.grad().isnan().any().item<bool>()) << "softcap " << softcap;
    EXPECT_TRUE(at::allclose(x.grad(), y.grad(), 1e-5, 1e-7)) << "softcap " << softcap;
  }
}

// The upstream rule both kernels share: exactly 1 leaves the gradient as it is (bit for bit,
// NaN rows too); anything else, 1 + ulp, 0 and NaN included, scales it.
TEST(KernelMath, UpstreamOfExactlyOneLeavesTheGradientAsIs) {
  EXPECT_TRUE(leaves_gradient_as_is(1.0f));
  for (const float u : {std::nextafter(1.0f, 2.0f), 0.0f, -1.0f, NAN})
    EXPECT_FALSE(leaves_gradient_as_is(u)) << u;
  const std::vector<float> original{0.25f, -3.0f, NAN, -0.0f, 1e-30f};
  std::vector<float> g = original;
  const float one = 1.0f, half = 0.5f;
  scale_by_upstream_cpu(g.data(), static_cast<std::int64_t>(g.size()), &one);
  EXPECT_EQ(0, std::memcmp(g.data(), original.data(), g.size() * sizeof(float)));
  scale_by_upstream_cpu(g.data(), static_cast<std::int64_t>(g.size()), &half);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(original[i]))
      EXPECT_TRUE(std::isnan(g[i]));
    else
      EXPECT_EQ(g[i], original[i] * 0.5f) << i;
  }
}

// The CUDA kernel choice (cluster_plan): on Hopper, production vocabularies take the
// smallest cluster whose blocks hold at most 112 KB each; what does not fit, and every
// device without clusters, takes the two-pass kernel.
TEST(KernelMath, ClusterPlanPicksTheSmallestClusterThatFits) {
  const DeviceLimits hopper{9, true, 227 * 1024}, ampere{8, false, 163 * 1024};
  struct Want {
    std::int64_t vocab;
    int blocks;
  };
  for (const Want w : {Want{128, 1}, Want{32000, 2}, Want{50257, 2}, Want{131072, 8},
                       Want{151936, 8}, Want{204800, 8}, Want{262144, 0}}) {
    const ClusterPlan plan = cluster_plan(w.vocab / 4, hopper);
    EXPECT_EQ(plan.blocks, w.blocks) << "V " << w.vocab;
    if (plan.blocks == 0) continue;
    EXPECT_LE(plan.shared_bytes, kClusterBlockBudget) << "V " << w.vocab;
    EXPECT_EQ(plan.shared_bytes, static_cast<std::size_t>(plan.quads_per_block) * 16);
    if (plan.blocks > 1) {  // a smaller cluster would not fit
      const std::int64_t half = plan.blocks / 2;
      EXPECT_GT(static_cast<std::size_t>((w.vocab / 4 + half - 1) / half) * 16, kClusterBlockBudget)
          << "V " << w.vocab;
    }
  }
  EXPECT_EQ(cluster_plan(131072 / 4, ampere).blocks, 0);
  EXPECT_EQ(cluster_plan(128 / 4, DeviceLimits{9, false, 227 * 1024}).blocks, 0);
  EXPECT_EQ(cluster_plan(0, hopper).blocks, 0);
  // A device that opts in less shared memory than the budget bounds the blocks by it.
  const ClusterPlan small = cluster_plan(32000 / 4, DeviceLimits{9, true, 48 * 1024});
  EXPECT_EQ(small.blocks, 4);
  EXPECT_LE(small.shared_bytes, 48u * 1024);
}

// The blocks of a cluster cover a row's aligned middle exactly once, for every alignment
// of the row (its float4 count is V / 4 or one less) and every planned vocabulary.
TEST(KernelMath, ClusterBlocksPartitionTheRow) {
  const DeviceLimits hopper{9, true, 227 * 1024};
  for (const std::int64_t vocab : {4, 7, 1000, 32000, 50257, 131072, 151936, 204800}) {
    for (std::uintptr_t address = 0; address < 16; address += 4) {
      const VectorSpan span = vector_span(address, vocab);
      const ClusterPlan plan = cluster_plan(vocab / 4, hopper);
      ASSERT_GT(plan.blocks, 0) << vocab;
      std::int64_t next = 0;
      for (int part = 0; part < plan.blocks; ++part) {
        const QuadRange r = quads_of_block(plan, part, span.quads);
        EXPECT_EQ(r.begin, next) << "V " << vocab << " part " << part;
        EXPECT_LE(r.end - r.begin, plan.quads_per_block);
        next = r.end;
      }
      EXPECT_EQ(next, span.quads) << "V " << vocab << " address " << address;
    }
  }
}

}  // namespace
}  // namespace cpkit::kernels
