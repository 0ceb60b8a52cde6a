// Bad input to the optimized path raises cpkit::Error naming the argument and the values.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include <functional>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/process_group.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "expect_rejected.hpp"

namespace cpkit {
namespace {

const auto expect_rejected = &cpkit::test::expect_rejected<Error>;

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

TEST(BadInputOptimized, LossLogitsNotFloat32) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}, at::kDouble), at::zeros({1, 3}, at::kLong),
                        at::ones({3}, at::kBool), nullptr);
      },
      "logits", {"Float", "Double"});
}

TEST(BadInputOptimized, LossLogitsNotContiguous) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 4, 3}).transpose(1, 2), at::zeros({1, 3}, at::kLong),
                        at::ones({3}, at::kBool), nullptr);
      },
      "logits", {"contiguous", "[1, 3, 4]"});
}

TEST(BadInputOptimized, LossUpstreamOfMoreThanOneElement) {
  expect_rejected(
      [] {
        scale_loss_gradient_(at::zeros({1, 3, 4}), at::ones({2}));
      },
      "upstream", {"one element", "[2]"});
}

TEST(BadInputOptimized, LossGradientToScaleNotFloat32) {
  expect_rejected(
      [] {
        scale_loss_gradient_(at::zeros({1, 3, 4}, at::kDouble), at::ones({}));
      },
      "grad_logits", {"Float", "Double"});
}

TEST(BadInputOptimized, LossLabelOutsideVocabulary) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), ints({0, 7, 1}), at::ones({3}, at::kBool), nullptr);
      },
      "labels", {"value 7", "[0, 1]", "[0, 4)"});
}

TEST(BadInputOptimized, LossValidOfWrongLength) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), ints({0, 1, 1}), at::ones({5}, at::kBool), nullptr);
      },
      "valid", {"5 entries", "B * L = 3"});
}

TEST(BadInputOptimized, LossVocabularyOfOne) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 1}), ints({0, 0, 0}), at::ones({3}, at::kBool), nullptr);
      },
      "logits", {"got 1"});
}

TEST(BadInputOptimized, LossValidOnIgnoredLabel) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), ints({0, -100, 1}), at::ones({3}, at::kBool),
                        nullptr);
      },
      "valid", {"token 1", "-100"});
}

TEST(BadInputOptimized, SlotsExceedRow) {
  CPBatch b = packed();
  b.seq_lens_padded = ints({3, 4, -1000});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens_padded",
                  {"sum to 7", "T = 6"});
}

TEST(BadInputOptimized, MisplacedSentinel) {
  CPBatch b = packed();
  b.seq_lens = ints({-1000, 3, 2});
  b.seq_lens_padded = ints({-1000, 4, 2});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens",
                  {"entry 1", "follows a -1000"});
}

TEST(BadInputOptimized, NumChunksNotDividingBatch) {
  CPBatch b;
  b.input_ids = at::zeros({3, 4}, at::kLong);
  b.labels = at::zeros({3, 4}, at::kLong);
  expect_rejected([&] { prepare_cp_inputs_for(b, 2, 2); }, "num_chunks", {"B = 3", "got 2"});
}

TEST(BadInputOptimized, WrongFormatForTheCall) {
  expect_rejected([] { prepare_cp_inputs(packed(), nullptr); }, "qkv_format", {"thd"});
  // The all-ranks variants check it too.
  expect_rejected([] { prepare_cp_inputs_for(packed(), 2); }, "qkv_format",
                  {"prepare_cp_inputs_for", "\"thd\""});
  CPBatch bshd = packed();
  bshd.qkv_format = "bshd";
  expect_rejected([&] { prepare_packed_cp_inputs_for(bshd, 2, 1); }, "qkv_format",
                  {"prepare_packed_cp_inputs_for", "\"bshd\""});
}

TEST(BadInputOptimized, ImageWithWrongRank) {
  CPBatch b = packed();
  b.images.push_back(at::zeros({3, 4}));
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "images",
                  {"image 0", "2 dimensions"});
}

TEST(BadInputOptimized, EmptyBatch) {
  CPBatch b;
  b.input_ids = at::zeros({0, 4}, at::kLong);
  b.labels = at::zeros({0, 4}, at::kLong);
  expect_rejected([&] { prepare_cp_inputs_for(b, 2); }, "labels", {"empty", "[0, 4]"});
}

TEST(BadInputOptimized, GatherOfZeroDimTensor) {
  expect_rejected([] { gather_tokens(at::zeros({}), nullptr, true); }, "value", {"0-d"});
}

TEST(BadInputOptimized, SharderRankOutOfRange) {
  const Sharder s = prepare_packed_cp_inputs_for(packed(), 2, 1);
  expect_rejected([&] { s.local(0, 2); }, "rank", {"[0, 2)", "got 2"});
  expect_rejected([&] { s.local(3, 0); }, "microbatch", {"got 3"});
}

}  // namespace
}  // namespace cpkit

namespace cpkit {
namespace {

// A negative or non-finite cap means nothing: an error, not silently "off".
TEST(BadInputOptimized, SoftcapNegativeOrNotFinite) {
  for (const double cap : {-1.0, -1e-9, std::nan(""), double{INFINITY}})
    expect_rejected(
        [&] {
          shifted_cp_loss(at::zeros({1, 3, 4}), at::zeros({1, 3}, at::kLong),
                          at::ones({3}, at::kBool), nullptr, {.softcap = cap});
        },
        "softcap", {"must be finite and >= 0"});
}

TEST(BadInputOptimized, LabelsOfFloatDtype) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), at::zeros({1, 3}), at::ones({3}, at::kBool), nullptr);
      },
      "labels", {"Long", "Float"});
}

TEST(BadInputOptimized, LabelsOfWrongRank) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), at::zeros({3}, at::kLong), at::ones({3}, at::kBool),
                        nullptr);
      },
      "labels", {"2 dimensions", "got 1"});
}

TEST(BadInputOptimized, LogitsOfWrongRank) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({3, 4}), at::zeros({1, 3}, at::kLong), at::ones({3}, at::kBool),
                        nullptr);
      },
      "logits", {"3 dimensions", "[3, 4]"});
}

TEST(BadInputOptimized, ValidNotBool) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}), at::zeros({1, 3}, at::kLong), at::ones({3}), nullptr);
      },
      "valid", {"Bool", "Float"});
}

TEST(BadInputOptimized, TensorsOnDifferentDevices) {
  expect_rejected(
      [] {
        shifted_cp_loss(at::zeros({1, 3, 4}),
                        at::zeros({1, 3}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)),
                        at::ones({3}, at::kBool), nullptr);
      },
      "labels", {"share a device", "meta"});
}

TEST(BadInputOptimized, SeqLensOfFloatDtype) {
  CPBatch b = packed();
  b.seq_lens = b.seq_lens.to(at::kFloat);
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens", {"Long", "Float"});
}

TEST(BadInputOptimized, SeqLensShapesDisagree) {
  CPBatch b = packed();
  b.seq_lens_padded = ints({2, 4});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens_padded",
                  {"[1, 2]", "[1, 3]"});
}

TEST(BadInputOptimized, NegativeSeqLen) {
  CPBatch b = packed();
  b.seq_lens = ints({-3, 3, -1000});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens", {"negative", "-3"});
}

TEST(BadInputOptimized, SeqLenLongerThanSlot) {
  CPBatch b = packed();
  b.seq_lens = ints({2, 5, -1000});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "seq_lens",
                  {"length 5", "only 4"});
}

TEST(BadInputOptimized, NonPositiveOptions) {
  expect_rejected([] { prepare_packed_cp_inputs_for(packed(), 2, 0); }, "num_chunks", {"got 0"});
  expect_rejected([] { prepare_packed_cp_inputs_for(packed(), 2, 1, true, {.pad_multiple = 0}); },
                  "pad_multiple", {"got 0"});
  expect_rejected([] { prepare_packed_cp_inputs_for(packed(), 0, 1); }, "mesh", {"got 0"});
}

TEST(BadInputOptimized, AttentionMaskNotBinary) {
  CPBatch b;
  b.input_ids = at::zeros({1, 4}, at::kLong);
  b.labels = at::zeros({1, 4}, at::kLong);
  b.attention_mask = ints({1, 1, 3, 1});
  expect_rejected([&] { prepare_cp_inputs_for(b, 2); }, "attention_mask", {"value 3", "[0, 2]"});
}

TEST(BadInputOptimized, PositionIdsOfWrongShape) {
  CPBatch b;
  b.input_ids = at::zeros({1, 4}, at::kLong);
  b.labels = at::zeros({1, 4}, at::kLong);
  b.position_ids = ints({0, 1, 2});
  expect_rejected([&] { prepare_cp_inputs_for(b, 2); }, "position_ids", {"[1, 3]", "[1, 4]"});
}

TEST(BadInputOptimized, BothOrNeitherPrimary) {
  CPBatch b = packed();
  b.inputs_embeds = at::zeros({1, 6, 2});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "input_ids", {"both"});
  b.input_ids = at::Tensor();
  b.inputs_embeds = at::Tensor();
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "input_ids", {"neither"});
}

TEST(BadInputOptimized, EmbeddingsOfIntegerDtype) {
  CPBatch b = packed();
  b.input_ids = at::Tensor();
  b.inputs_embeds = at::zeros({1, 6, 2}, at::kLong);
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "inputs_embeds",
                  {"floating point", "Long"});
}

TEST(BadInputOptimized, NegativeLabelOtherThanIgnore) {
  CPBatch b = packed();
  b.labels = ints({1, 2, -7, 4, 5, 6});
  expect_rejected([&] { prepare_packed_cp_inputs_for(b, 2, 1); }, "labels", {"-7", "[0, 2]"});
}

TEST(BadInputOptimized, FromMapValueOfTheWrongKind) {
  std::unordered_map<std::string, c10::IValue> m;
  m["images"] = at::zeros({3, 2, 2});
  expect_rejected([&] { CPBatch::from_map(m); }, "images", {"list of tensors"});
}

TEST(BadInputOptimized, SplicedOfTheWrongShape) {
  const Sharder s = prepare_packed_cp_inputs_for(packed(), 2, 1, false);
  expect_rejected(
      [&] {
        s.cut_spliced(0, 0, at::zeros({1, 5, 3}));
      },
      "spliced", {"[1, 5, 3]", "[1, 6"});
}

TEST(BadInputOptimized, GatherOfUnsupportedDtype) {
  expect_rejected(
      [] {
        gather_tokens(at::zeros({2, 2}, at::kDouble), nullptr, true);
      },
      "value", {"Double", "not supported"});
}

TEST(BadInputOptimized, GlooMeshRankOutOfRange) {
  expect_rejected([] { make_gloo_mesh("/tmp/cpkit-never-used", 3, 2); }, "rank",
                  {"[0, 2)", "got 3"});
  expect_rejected([] { make_gloo_mesh("/tmp/cpkit-never-used", 0, 0); }, "size", {"got 0"});
}

}  // namespace
}  // namespace cpkit
