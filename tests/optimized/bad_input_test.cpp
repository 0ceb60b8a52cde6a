// The good batch next to the bad ones: the bad inputs themselves are one table shared with
// Python (tests/bad_inputs.json, run by bad_input_table_test.cpp).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "cpkit/optimized/sharder.hpp"

namespace cpkit {
namespace {

at::Tensor ints(std::vector<int64_t> v) { return at::tensor(v, at::kLong).unsqueeze(0); }

CPBatch packed() {
  CPBatch b;
  b.qkv_format = "thd";
  b.input_ids = ints({1, 2, 3, 4, 5, 6});
  b.labels = ints({1, 2, 3, 4, 5, 6});
  b.seq_lens = ints({2, 3, -1000});
  b.seq_lens_padded = ints({2, 4, -1000});
  return b;
}

// The good batch is accepted and sharded as the spec writes it out by hand: slots 2 and 4
// (the second with one padding token), a 2-token row tail at CP 4 (T_pad 8, L 2).
TEST(BadInputOptimized, GoodInputIsAccepted) {
  const Sharder s = prepare_packed_cp_inputs_for(packed(), 4, 1);
  std::vector<int64_t> documents, positions, labels;
  std::vector<bool> padding, valid;
  for (int r = 0; r < 4; ++r) {
    const LocalShard l = s.local(0, r);
    for (int64_t j = 0; j < 2; ++j) {
      documents.push_back(l.document_ids[0][j].item<int64_t>());
      positions.push_back(l.position_ids[0][j].item<int64_t>());
      labels.push_back(l.labels[0][j].item<int64_t>());
      padding.push_back(l.padding[0][j].item<bool>());
      valid.push_back(l.valid[j].item<bool>());
    }
  }
  EXPECT_EQ(documents, (std::vector<int64_t>{1, 1, 2, 2, 2, 2, 0, 0}));
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 0, 0}));
  EXPECT_EQ(labels, (std::vector<int64_t>{1, 2, 3, 4, 5, -100, -100, -100}));
  EXPECT_EQ(padding, (std::vector<bool>{false, false, false, false, false, true, true, true}));
  EXPECT_EQ(valid, (std::vector<bool>{false, true, false, true, true, false, false, false}));
}

}  // namespace
}  // namespace cpkit
