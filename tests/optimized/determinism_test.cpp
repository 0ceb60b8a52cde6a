// The optimized CPU path is deterministic: the same inputs give bitwise-identical shards,
// losses and gradients across runs and across intra-op thread counts (1 and 2).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit {
namespace {

struct Outputs {
  std::vector<at::Tensor> tensors;
};

// Shards big enough that the sharding loops split across threads (their grain is 65536
// tokens: a THD fragment of 75000, a BSHD pass over 2 x 40000), then a loss on a smaller
// shard (its rows split across threads at any size).
Outputs run_once(int threads, double softcap) {
  at::set_num_threads(threads);
  at::manual_seed(21);
  CPBatch packed;
  packed.qkv_format = "thd";
  packed.input_ids = at::randint(1, 1000, {1, 150000}, at::kLong);
  packed.labels = packed.input_ids.clone();
  packed.seq_lens =
      at::tensor(std::vector<int64_t>{90000, 0, 17000, 40000}, at::kLong).view({1, 4});
  packed.seq_lens_padded =
      at::tensor(std::vector<int64_t>{91000, 1, 18000, 40000}, at::kLong).view({1, 4});
  CPBatch bshd;
  bshd.input_ids = at::randint(1, 1000, {2, 80000}, at::kLong);
  bshd.labels = bshd.input_ids.clone();
  bshd.attention_mask = at::ones({2, 80000}, at::kLong);
  bshd.attention_mask.narrow(1, 0, 123).zero_();
  Outputs out;
  for (const Sharder& s :
       {prepare_packed_cp_inputs_for(packed, 2, 1), prepare_cp_inputs_for(bshd, 2)})
    for (int r = 0; r < 2; ++r) {
      const LocalShard l = s.local(0, r);
      out.tensors.insert(out.tensors.end(), {l.input_ids, l.labels, l.position_ids, l.document_ids,
                                             l.padding, l.valid});
    }
  const LocalShard l = prepare_cp_inputs_for(bshd, 160).local(0, 7);  // [2, 500]
  const at::Tensor logits = (at::randn({2, l.layout.local_len, 3001}) * 7).requires_grad_(true);
  const at::Tensor loss = shifted_cp_loss(logits, l.labels, l.valid, nullptr, {.softcap = softcap});
  out.tensors.push_back(loss.detach());
  out.tensors.push_back(torch::autograd::grad({loss}, {logits})[0]);
  return out;
}

TEST(Determinism, BitwiseAcrossRunsAndThreadCounts) {
  for (const double softcap : {0.0, 30.0}) {
    const Outputs one = run_once(1, softcap);
    const Outputs again = run_once(1, softcap);
    const Outputs two = run_once(2, softcap);
    ASSERT_EQ(one.tensors.size(), two.tensors.size());
    for (std::size_t i = 0; i < one.tensors.size(); ++i) {
      EXPECT_TRUE(at::equal(one.tensors[i], again.tensors[i])) << "tensor " << i << " between runs";
      EXPECT_TRUE(at::equal(one.tensors[i], two.tensors[i])) << "tensor " << i << " 1 vs 2 threads";
    }
  }
}

}  // namespace
}  // namespace cpkit
