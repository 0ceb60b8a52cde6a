// Bad input is rejected with cpkit::reference::Error naming the argument and the values.
#include <gtest/gtest.h>

#include <cmath>

#include <functional>
#include <string>

#include "cpkit/reference/reference.hpp"
#include "expect_rejected.hpp"
#include "literals.hpp"

namespace cpkit::reference {
namespace {

using testing::ints;

const auto expect_rejected = &cpkit::test::expect_rejected<Error>;

BshdBatch good_bshd() {
  BshdBatch b;
  b.input_ids = IntMatrix::Constant(2, 5, 3);
  b.labels = IntMatrix::Constant(2, 5, 1);
  return b;
}

PackedBatch good_packed() {
  PackedBatch b;
  b.input_ids = ints({1, 2, 3, 4, 5, 6});
  b.labels = ints({1, 2, 3, 4, 5, 6});
  b.seq_lens = ints({2, 3, kSeqLenSentinel});
  b.seq_lens_padded = ints({2, 4, kSeqLenSentinel});
  return b;
}

TEST(BadInputReference, GoodBatchesAreAccepted) {
  EXPECT_NO_THROW(prepare_cp_inputs(good_bshd(), {.cp_size = 4, .num_chunks = 2}));
  EXPECT_NO_THROW(prepare_packed_cp_inputs(good_packed(), {.cp_size = 4}));
}

TEST(BadInputReference, EmptyBatch) {
  BshdBatch b;
  b.input_ids = IntMatrix(0, 4);
  b.labels = IntMatrix(0, 4);
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "labels", {"empty", "[0, 4]"});
}

TEST(BadInputReference, BothOrNeitherPrimary) {
  BshdBatch b = good_bshd();
  b.inputs_embeds = FloatRows(2, FloatMatrix::Zero(5, 3));
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "input_ids", {"both"});
  b.input_ids.reset();
  b.inputs_embeds.reset();
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "input_ids", {"neither"});
}

TEST(BadInputReference, LabelsShapeDiffersFromIds) {
  BshdBatch b = good_bshd();
  b.labels = IntMatrix::Constant(2, 4, 1);
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "input_ids", {"[2, 5]", "[2, 4]"});
}

TEST(BadInputReference, EmbedsOfUnequalHidden) {
  BshdBatch b = good_bshd();
  b.input_ids.reset();
  b.inputs_embeds = FloatRows{FloatMatrix::Zero(5, 3), FloatMatrix::Zero(5, 2)};
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "inputs_embeds", {"row 1", "[5, 2]"});
}

TEST(BadInputReference, NumChunksNotDividingBatch) {
  expect_rejected([&] { prepare_cp_inputs(good_bshd(), {.num_chunks = 3}); }, "num_chunks",
                  {"B = 2", "got 3"});
}

TEST(BadInputReference, NonPositiveOptions) {
  expect_rejected([&] { prepare_cp_inputs(good_bshd(), {.num_chunks = 0}); }, "num_chunks",
                  {"got 0"});
  expect_rejected([&] { prepare_cp_inputs(good_bshd(), {.pad_multiple = -2}); }, "pad_multiple",
                  {"got -2"});
  expect_rejected([&] { prepare_cp_inputs(good_bshd(), {.cp_size = 0}); }, "cp_size", {"got 0"});
}

TEST(BadInputReference, AttentionMaskNotBinary) {
  BshdBatch b = good_bshd();
  b.attention_mask = IntMatrix::Ones(2, 5);
  (*b.attention_mask)(1, 3) = 2;
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "attention_mask", {"value 2", "[1, 3]"});
}

TEST(BadInputReference, NegativeLabelOtherThanIgnore) {
  BshdBatch b = good_bshd();
  b.labels(0, 2) = -7;
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "labels", {"-7", "[0, 2]"});
}

TEST(BadInputReference, ImageWithWrongRank) {
  BshdBatch b = good_bshd();
  b.images.push_back({{3, 4}, std::vector<float>(12)});
  expect_rejected([&] { prepare_cp_inputs(b, {}); }, "images", {"image 0", "2 dimensions"});
}

TEST(BadInputReference, SlotsExceedRow) {
  PackedBatch b = good_packed();
  b.seq_lens_padded = ints({3, 4, kSeqLenSentinel});
  expect_rejected([&] { prepare_packed_cp_inputs(b, {}); }, "seq_lens_padded",
                  {"sum to 7", "T = 6"});
}

TEST(BadInputReference, SeqLenLongerThanSlot) {
  PackedBatch b = good_packed();
  b.seq_lens = ints({2, 5, kSeqLenSentinel});
  expect_rejected([&] { prepare_packed_cp_inputs(b, {}); }, "seq_lens", {"length 5", "only 4"});
}

TEST(BadInputReference, NegativeSeqLen) {
  PackedBatch b = good_packed();
  b.seq_lens = ints({-1, 3, kSeqLenSentinel});
  expect_rejected([&] { prepare_packed_cp_inputs(b, {}); }, "seq_lens", {"negative", "-1"});
}

TEST(BadInputReference, MisplacedSentinel) {
  PackedBatch b = good_packed();
  b.seq_lens = ints({kSeqLenSentinel, 3, 2});
  b.seq_lens_padded = ints({kSeqLenSentinel, 4, 2});
  expect_rejected([&] { prepare_packed_cp_inputs(b, {}); }, "seq_lens",
                  {"entry 1", "follows a -1000"});
  b = good_packed();
  b.seq_lens_padded = ints({2, 4, 0});
  expect_rejected([&] { prepare_packed_cp_inputs(b, {}); }, "seq_lens_padded",
                  {"entry 2", "same places"});
}

TEST(BadInputReference, PackedRowsDisagreeWithNumChunks) {
  expect_rejected([&] { prepare_packed_cp_inputs(good_packed(), {.num_chunks = 2}); }, "num_chunks",
                  {"1 rows", "num_chunks = 2"});
}

TEST(BadInputReference, LossLabelOutsideVocabulary) {
  const IntMatrix labels = ints({0, 9, 1});
  const BoolVector valid = BoolVector::Constant(3, true);
  expect_rejected([&] { shifted_cp_loss({FloatMatrix::Zero(3, 4)}, {labels}, {valid}); }, "labels",
                  {"value 9", "[0, 4)"});
}

TEST(BadInputReference, LossValidOfWrongLength) {
  const IntMatrix labels = ints({0, 1, 1});
  expect_rejected(
      [&] { shifted_cp_loss({FloatMatrix::Zero(3, 4)}, {labels}, {BoolVector::Ones(2)}); }, "valid",
      {"2 entries", "B * L = 3"});
}

TEST(BadInputReference, LossSoftcapNegativeOrNotFinite) {
  const IntMatrix labels = ints({0, 1});
  for (const double cap : {-1.0, -1e-9, std::nan(""), double{INFINITY}})
    expect_rejected(
        [&] {
          shifted_cp_loss({FloatMatrix::Zero(2, 4)}, {labels}, {BoolVector::Ones(2)},
                          {.softcap = cap});
        },
        "softcap", {"must be finite and >= 0"});
}

TEST(BadInputReference, LossVocabularyOfOne) {
  const IntMatrix labels = ints({0, 0});
  expect_rejected(
      [&] { shifted_cp_loss({FloatMatrix::Zero(2, 1)}, {labels}, {BoolVector::Ones(2)}); },
      "logits", {"got 1"});
}

TEST(BadInputReference, LossRanksWithDifferentShapes) {
  const IntMatrix a = ints({0, 1, 1});
  const IntMatrix b = ints({0, 1});
  expect_rejected(
      [&] {
        shifted_cp_loss({FloatMatrix::Zero(3, 4), FloatMatrix::Zero(2, 4)}, {a, b},
                        {BoolVector::Ones(3), BoolVector::Ones(2)});
      },
      "labels", {"rank 1", "[1, 2]", "[1, 3]"});
}

TEST(BadInputReference, GatherCountsDiffer) {
  expect_rejected(
      [&] {
        gather_tokens(std::vector<FloatMatrix>{FloatMatrix::Zero(3, 2), FloatMatrix::Zero(4, 2)});
      },
      "value", {"rank 0 holds 3", "rank 1 holds 4"});
  expect_rejected(
      [&] {
        gather_tokens(std::vector<FloatMatrix>{FloatMatrix::Zero(3, 2), FloatMatrix::Zero(3, 5)});
      },
      "value", {"trailing size 2", "has 5"});
}

TEST(BadInputReference, SharderRankOutOfRange) {
  const Sharder s = prepare_cp_inputs(good_bshd(), {.cp_size = 2});
  expect_rejected([&] { s.local(0, 2); }, "rank", {"[0, 2)", "got 2"});
  expect_rejected([&] { s.local(5, 0); }, "microbatch", {"got 5"});
}

}  // namespace
}  // namespace cpkit::reference
