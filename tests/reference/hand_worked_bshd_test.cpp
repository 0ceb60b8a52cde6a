// A BSHD case small enough to check by hand; docs/hand-worked.md shows the arithmetic.
// B = 1, S = 5, CP = 2, V = 4 -> S_pad = 6, L = 3.
#include <gtest/gtest.h>

#include <cmath>

#include "cpkit/reference/reference.hpp"
#include "literals.hpp"

namespace cpkit::reference {
namespace {

using testing::flags;
using testing::ints;
using testing::same;

BshdBatch hand_batch() {
  BshdBatch batch;
  batch.input_ids = ints({11, 12, 13, 14, 15});
  batch.labels = ints({1, 2, kIgnoreLabel, 3, 0});
  return batch;
}

TEST(HandWorkedBshd, ShardsMatchHandArithmetic) {
  const Sharder sharder = prepare_cp_inputs(hand_batch(), {.cp_size = 2});
  const LocalShard r0 = sharder.local(0, 0);
  const LocalShard r1 = sharder.local(0, 1);

  EXPECT_EQ(r0.layout.seq_len, 5);
  EXPECT_EQ(r0.layout.padded_len, 6);
  EXPECT_EQ(r0.layout.local_len, 3);
  EXPECT_EQ(r1.layout.begin, 3);
  EXPECT_EQ(r1.layout.end, 6);

  EXPECT_TRUE(same(*r0.input_ids, ints({11, 12, 13})));
  EXPECT_TRUE(same(*r1.input_ids, ints({14, 15, 0})));
  EXPECT_TRUE(same(r0.labels, ints({1, 2, -100})));
  EXPECT_TRUE(same(r1.labels, ints({3, 0, -100})));
  EXPECT_TRUE(same(r0.position_ids, ints({0, 1, 2})));
  EXPECT_TRUE(same(r1.position_ids, ints({3, 4, 5})));
  EXPECT_TRUE(same(r0.document_ids, ints({1, 1, 1})));
  EXPECT_TRUE(same(r1.document_ids, ints({1, 1, 0})));
  EXPECT_TRUE(same(r0.padding, flags("000")));
  EXPECT_TRUE(same(r1.padding, flags("001")));
  EXPECT_TRUE(same(flags(r0.valid), flags("010")));
  EXPECT_TRUE(same(flags(r1.valid), flags("110")));
}

TEST(HandWorkedBshd, LossMatchesHandArithmetic) {
  const Sharder sharder = prepare_cp_inputs(hand_batch(), {.cp_size = 2});
  // All-zero logits (CE = ln 4) except rank 1 position 0: ln [1, 2, 3, 2], target 0 -> ln 8.
  FloatMatrix logits0 = FloatMatrix::Zero(3, 4);
  FloatMatrix logits1 = FloatMatrix::Zero(3, 4);
  logits1.row(0) << 0.0f, std::log(2.0f), std::log(3.0f), std::log(2.0f);
  const auto r0 = sharder.local(0, 0);
  const auto r1 = sharder.local(0, 1);
  const auto losses =
      shifted_cp_loss({logits0, logits1}, {r0.labels, r1.labels}, {r0.valid, r1.valid});

  const double ln2 = std::log(2.0);
  EXPECT_EQ(losses[0].local_targets, 2);  // targets 2 and, across the boundary, 3
  EXPECT_EQ(losses[1].local_targets, 1);  // target 0; position 4 predicts padding
  EXPECT_EQ(losses[0].global_targets, 3);
  EXPECT_NEAR(losses[0].value, 8.0 / 3.0 * ln2, 1e-6);  // (ln 4 + ln 4) * 2 / 3
  EXPECT_NEAR(losses[1].value, 2.0 * ln2, 1e-6);        // ln 8 * 2 / 3
  EXPECT_NEAR((losses[0].value + losses[1].value) / 2, 7.0 / 3.0 * ln2, 1e-6);

  // Gradient rows: (softmax - onehot) * CP / N.
  const float g0[] = {1.0f / 6, 1.0f / 6, -0.5f, 1.0f / 6};    // rank 0, j = 0, target 2
  const float g2[] = {1.0f / 6, 1.0f / 6, 1.0f / 6, -0.5f};    // rank 0, j = 2, target 3
  const float g1[] = {-7.0f / 12, 1.0f / 6, 0.25f, 1.0f / 6};  // rank 1, j = 0, target 0
  for (int v = 0; v < 4; ++v) {
    EXPECT_NEAR(losses[0].grad_logits(0, v), g0[v], 1e-6);
    EXPECT_EQ(losses[0].grad_logits(1, v), 0.0f);  // its target is -100
    EXPECT_NEAR(losses[0].grad_logits(2, v), g2[v], 1e-6);
    EXPECT_NEAR(losses[1].grad_logits(0, v), g1[v], 1e-6);
    EXPECT_EQ(losses[1].grad_logits(1, v), 0.0f);
    EXPECT_EQ(losses[1].grad_logits(2, v), 0.0f);
  }

  // The single-device truth on the unsharded batch gives the same mean.
  FloatMatrix full = FloatMatrix::Zero(5, 4);
  full.row(3) = logits1.row(0);
  EXPECT_NEAR(single_device_shifted_loss(full, hand_batch().labels).value, 7.0 / 3.0 * ln2, 1e-6);
}

}  // namespace
}  // namespace cpkit::reference
