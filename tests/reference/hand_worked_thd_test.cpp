// A packed (THD) case small enough to check by hand; docs/hand-worked.md shows the arithmetic.
// T = 10, CP = 3, seq_lens [3, 0, 4], seq_lens_padded [4, 1, 4] -> T_pad = 12, L = 4.
#include <gtest/gtest.h>

#include <cmath>

#include "cpkit/reference/reference.hpp"
#include "literals.hpp"

namespace cpkit::reference {
namespace {

using testing::flags;
using testing::ints;
using testing::same;

PackedBatch hand_batch() {
  PackedBatch batch;
  batch.input_ids = ints({100, 101, 102, 103, 104, 105, 106, 107, 108, 109});
  batch.labels = ints({5, 6, 7, 8, 9, 10, 11, 12, 13, 14});
  batch.seq_lens = ints({3, 0, 4, kSeqLenSentinel});
  batch.seq_lens_padded = ints({4, 1, 4, kSeqLenSentinel});
  return batch;
}

TEST(HandWorkedThd, GlobalStreamsMatchHandArithmetic) {
  const Sharder sharder = prepare_packed_cp_inputs(hand_batch(), {.cp_size = 3});
  const GlobalStreams& g = sharder.global(0);
  EXPECT_EQ(g.padded_len, 12);
  EXPECT_TRUE(same(g.document_ids, ints({1, 1, 1, 1, 2, 3, 3, 3, 3, 0, 0, 0})));
  EXPECT_TRUE(same(g.position_ids, ints({0, 1, 2, 3, 0, 0, 1, 2, 3, 0, 0, 0})));
  EXPECT_TRUE(same(g.padding, flags("000110000111")));
  EXPECT_TRUE(same(g.labels, ints({5, 6, 7, -100, -100, 10, 11, 12, 13, -100, -100, -100})));
  EXPECT_TRUE(same(g.valid, flags("011000111000")));
  EXPECT_TRUE(same(ints(g.cu_seqlens), ints({0, 3, 3, 7})));
  EXPECT_TRUE(same(ints(g.cu_seqlens_padded), ints({0, 4, 5, 9})));
}

TEST(HandWorkedThd, ShardsMatchHandArithmetic) {
  const Sharder sharder = prepare_packed_cp_inputs(hand_batch(), {.cp_size = 3});
  const LocalShard r1 = sharder.local(0, 1);
  const LocalShard r2 = sharder.local(0, 2);
  EXPECT_EQ(r1.layout.begin, 4);
  EXPECT_TRUE(same(*r1.input_ids, ints({104, 105, 106, 107})));
  EXPECT_TRUE(same(*r2.input_ids, ints({108, 109, 0, 0})));
  EXPECT_TRUE(same(r1.document_ids, ints({2, 3, 3, 3})));
  EXPECT_TRUE(same(r2.document_ids, ints({3, 0, 0, 0})));
  EXPECT_TRUE(same(r1.position_ids, ints({0, 0, 1, 2})));
  EXPECT_TRUE(same(r2.position_ids, ints({3, 0, 0, 0})));
  EXPECT_TRUE(same(flags(r1.valid), flags("0011")));
  EXPECT_TRUE(same(flags(r2.valid), flags("1000")));
}

TEST(HandWorkedThd, MaskFollowsDocumentsAcrossShards) {
  const Sharder sharder = prepare_packed_cp_inputs(hand_batch(), {.cp_size = 3});
  const GlobalStreams& g = sharder.global(0);
  TokenMeta meta{g.position_ids.row(0).transpose(), g.document_ids.row(0).transpose(),
                 g.padding.row(0).transpose()};
  // Query 8 (rank 2, document 3, position 3) sees keys 5..8 on rank 1 and itself.
  for (Eigen::Index k = 0; k < 12; ++k)
    EXPECT_EQ(attention_allowed(meta, 8, meta, k), k >= 5 && k <= 8) << "key " << k;
  // Query 2 (document 1, position 2) sees keys 0..2; key 3 is its slot padding.
  for (Eigen::Index k = 0; k < 12; ++k)
    EXPECT_EQ(attention_allowed(meta, 2, meta, k), k <= 2) << "key " << k;
  // The zero-length document 2 and the row tail attend to nothing.
  for (Eigen::Index k = 0; k < 12; ++k) {
    EXPECT_FALSE(attention_allowed(meta, 4, meta, k));
    EXPECT_FALSE(attention_allowed(meta, 10, meta, k));
  }
}

TEST(HandWorkedThd, LossWithAnEmptyRank) {
  const Sharder sharder = prepare_packed_cp_inputs(hand_batch(), {.cp_size = 3});
  std::vector<FloatMatrix> logits;
  std::vector<IntMatrix> labels;
  std::vector<BoolVector> valid;
  for (int r = 0; r < 3; ++r) {
    const LocalShard s = sharder.local(0, r);
    logits.push_back(FloatMatrix::Zero(4, 16));  // CE = ln 16 for every target
    labels.push_back(s.labels);
    valid.push_back(s.valid);
  }
  const auto losses = shifted_cp_loss(logits, labels, valid);
  const double ln16 = std::log(16.0);
  EXPECT_EQ(losses[0].local_targets, 2);  // 6, 7
  EXPECT_EQ(losses[1].local_targets, 3);  // 11, 12 and 13 across the boundary
  EXPECT_EQ(losses[2].local_targets, 0);
  EXPECT_NEAR(losses[0].value, 2 * ln16 * 3 / 5, 1e-6);
  EXPECT_NEAR(losses[1].value, 3 * ln16 * 3 / 5, 1e-6);
  EXPECT_EQ(losses[2].value, 0.0);
  EXPECT_TRUE(losses[2].grad_logits.isZero());
  EXPECT_NEAR((losses[0].value + losses[1].value + losses[2].value) / 3, ln16, 1e-6);
}

}  // namespace
}  // namespace cpkit::reference
