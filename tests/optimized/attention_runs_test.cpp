// The varlen sequences cp_attention's CUDA path hands torch's flash kernels, checked on the
// CPU against what those kernels' masks show each query (bottom-right causal with a left
// window, or no mask): on random packed rows and BSHD batches at CP 1-8 in every layout,
// with and without windows, every query of every rank's key index sees exactly its listed
// slots, in order, in exactly one sequence (none when it sees nothing); the own keys and the
// received keys must be expressible without a window, every key index with one; the two
// overlapped stages (flash_stages) together show each query all its keys, the first stage
// only the rank's own.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "attention_runs.hpp"
#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit::detail {
namespace {

using Lists = std::vector<std::vector<std::int64_t>>;

// Each query's slots as flash's masks show them; a query in two sequences fails.
Lists seen_by_kernel(const VarlenRuns& runs, std::int64_t queries) {
  Lists seen(static_cast<std::size_t>(queries));
  std::vector<int> sequences(static_cast<std::size_t>(queries), 0);
  for (const bool causal : {true, false}) {
    const VarlenBatch& batch = causal ? runs.causal : runs.full;
    EXPECT_EQ(batch.cu_q.size(), batch.cu_k.size());
    for (std::size_t s = 0; s + 1 < batch.cu_q.size(); ++s) {
      const std::int64_t nq = batch.cu_q[s + 1] - batch.cu_q[s];
      const std::int64_t nk = batch.cu_k[s + 1] - batch.cu_k[s];
      EXPECT_GT(nq, 0);
      EXPECT_LE(nq, batch.max_q);
      EXPECT_LE(nk, batch.max_k);
      for (std::int64_t j = 0; j < nq; ++j) {
        const std::int64_t query = batch.queries[static_cast<std::size_t>(batch.cu_q[s] + j)];
        EXPECT_EQ(++sequences[static_cast<std::size_t>(query)], 1) << "query " << query;
        std::int64_t lo = 0, hi = nk - 1;
        if (causal) {
          hi = j + nk - nq;
          if (runs.left >= 0) lo = std::max<std::int64_t>(0, hi - runs.left);
        }
        for (std::int64_t t = lo; t <= hi; ++t)
          seen[static_cast<std::size_t>(query)].push_back(
              batch.key_slots[static_cast<std::size_t>(batch.cu_k[s] + t)]);
      }
    }
  }
  return seen;
}

Lists listed(const KeyIndex& index) {
  Lists out;
  for (std::size_t i = 0; i < index.begin.size(); ++i)
    out.emplace_back(index.slots.begin() + index.begin[i], index.slots.begin() + index.end[i]);
  return out;
}

void expect_exact(const KeyIndex& index, std::int64_t window, bool must_exist,
                  const std::string& what) {
  const auto runs = varlen_runs(index, window);
  if (!runs) {
    EXPECT_FALSE(must_exist) << what << " has no varlen form";
    return;
  }
  const auto queries = static_cast<std::int64_t>(index.begin.size());
  EXPECT_EQ(seen_by_kernel(*runs, queries), listed(index)) << what;
}

// A random packed row (documents with slot padding, empty ones, a row tail) or BSHD batch,
// cut for CP `cp` in a random layout.
Sharder random_shard(std::mt19937& rng, int cp) {
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  PadOptions pad;
  pad.layout = static_cast<LayoutKind>(uniform(0, 2));
  pad.pad_multiple = static_cast<int>(uniform(1, 3));
  CPBatch b;
  if (uniform(0, 3) == 0) {  // BSHD rows: contiguous or head_tail
    if (pad.layout == LayoutKind::kBalanced) pad.layout = LayoutKind::kHeadTail;
    b.input_ids = at::ones({uniform(1, 3), uniform(1, 40)}, at::kLong);
    b.labels = b.input_ids.clone();
    return prepare_cp_inputs_for(b, cp, 1, true, pad);
  }
  std::vector<std::int64_t> lens, slots;
  std::int64_t total = 0;
  for (std::int64_t d = uniform(1, 8); d > 0; --d) {
    const std::int64_t len = uniform(0, 3) == 0 ? uniform(0, 2) : uniform(1, 90);
    lens.push_back(len);
    slots.push_back(len + uniform(0, 2));
    total += slots.back();
  }
  b.input_ids = at::ones({1, total + uniform(0, 5)}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(lens).unsqueeze(0);
  b.seq_lens_padded = at::tensor(slots).unsqueeze(0);
  b.qkv_format = "thd";
  return prepare_packed_cp_inputs_for(b, cp, 1, true, pad);
}

TEST(AttentionRuns, VarlenSequencesShowEveryQueryExactlyItsKeys) {
  for (unsigned seed = 0; seed < 150; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int cp = std::vector<int>{1, 2, 3, 4, 8}[seed % 5];
    const Sharder sharder = random_shard(rng, cp);
    for (const std::int64_t window : {0, 1, 3, 16, 100})
      for (int r = 0; r < cp; ++r) {
        const AttentionPlan plan = attention_plan(sharder, 0, r, window);
        const std::string where =
            "rank " + std::to_string(r) + ", window " + std::to_string(window);
        expect_exact(plan.all_keys, window, true, "all keys, " + where);
        expect_exact(plan.own_keys, window, window == 0, "own keys, " + where);
        expect_exact(plan.remote_keys, window, window == 0, "received keys, " + where);
        const auto stages = flash_stages(plan);
        ASSERT_TRUE(stages.has_value()) << where;
        EXPECT_EQ(stages->merge, window == 0) << where;
        const std::int64_t own = plan.rows * plan.local_len;
        const auto queries = static_cast<std::int64_t>(plan.all_keys.begin.size());
        for (const VarlenBatch* b : {&stages->first.causal, &stages->first.full})
          for (const std::int64_t slot : b->key_slots) EXPECT_LT(slot, own) << where;
        if (stages->merge) {
          for (const VarlenBatch* b : {&stages->second.causal, &stages->second.full})
            for (const std::int64_t slot : b->key_slots) EXPECT_GE(slot, own) << where;
        }
        Lists together = seen_by_kernel(stages->first, queries), want = listed(plan.all_keys);
        const Lists second = seen_by_kernel(stages->second, queries);
        for (std::size_t i = 0; i < together.size(); ++i) {
          if (!stages->merge && !together[i].empty()) {
            EXPECT_TRUE(second[i].empty()) << "query " << i << ", " << where;
          }
          together[i].insert(together[i].end(), second[i].begin(), second[i].end());
          std::sort(together[i].begin(), together[i].end());
          std::sort(want[i].begin(), want[i].end());
        }
        EXPECT_EQ(together, want) << where;
      }
  }
}

TEST(AttentionRuns, RangesNoKernelMaskShowsHaveNoVarlenForm) {
  // One query seeing two keys: fine without a window or with one of 2, not with one of 1.
  const KeyIndex two_keys{{0, 1}, {0}, {2}};
  EXPECT_TRUE(varlen_runs(two_keys, 0).has_value());
  EXPECT_TRUE(varlen_runs(two_keys, 2).has_value());
  EXPECT_FALSE(varlen_runs(two_keys, 1).has_value());
  const KeyIndex past_the_end{{0, 1}, {0}, {3}};
  EXPECT_FALSE(varlen_runs(past_the_end, 0).has_value());
}

}  // namespace
}  // namespace cpkit::detail
