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

Outputs run_once(int threads, double softcap) {
  at::set_num_threads(threads);
  at::manual_seed(21);
  CPBatch b;
  b.qkv_format = "thd";
  b.input_ids = at::randint(1, 1000, {2, 4000}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens =
      at::tensor(std::vector<int64_t>{900, 0, 1700, 1200, 100, 2000, 1900, -1000}, at::kLong)
          .view({2, 4});
  b.seq_lens_padded =
      at::tensor(std::vector<int64_t>{1000, 0, 1800, 1200, 100, 2000, 1900, -1000}, at::kLong)
          .view({2, 4});
  const Sharder s = prepare_packed_cp_inputs_for(b, 4, 2);
  Outputs out;
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 4; ++r) {
      const LocalShard l = s.local(m, r);
      out.tensors.insert(out.tensors.end(), {l.input_ids, l.labels, l.position_ids, l.document_ids,
                                             l.padding, l.valid});
    }
  const LocalShard l = s.local(1, 2);
  const at::Tensor logits = (at::randn({1, l.layout.local_len, 3001}) * 7).requires_grad_(true);
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
