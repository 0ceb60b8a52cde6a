// The optimized Sharder on the hand-worked cases of docs/hand-worked.md, plus the
// shard_primary=false flow and the in-forward cut's gradient.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit {
namespace {

at::Tensor ints(std::vector<int64_t> v) { return at::tensor(v, at::kLong).unsqueeze(0); }
at::Tensor flags(const std::string& bits) {
  std::vector<int64_t> v;
  for (char c : bits) v.push_back(c == '1');
  return at::tensor(v, at::kLong).to(at::kBool).unsqueeze(0);
}

void expect_equal(const at::Tensor& actual, const at::Tensor& expected, const char* what) {
  EXPECT_TRUE(actual.sizes() == expected.sizes() && at::equal(actual, expected))
      << what << "\nactual:\n"
      << actual << "\nexpected:\n"
      << expected;
}

CPBatch hand_bshd() {
  CPBatch b;
  b.input_ids = ints({11, 12, 13, 14, 15});
  b.labels = ints({1, 2, -100, 3, 0});
  return b;
}

CPBatch hand_thd() {
  CPBatch b;
  b.qkv_format = "thd";
  b.input_ids = ints({100, 101, 102, 103, 104, 105, 106, 107, 108, 109});
  b.labels = ints({5, 6, 7, 8, 9, 10, 11, 12, 13, 14});
  b.seq_lens = ints({3, 0, 4, -1000});
  b.seq_lens_padded = ints({4, 1, 4, -1000});
  return b;
}

TEST(OptimizedSharder, HandWorkedBshd) {
  const Sharder s = prepare_cp_inputs_for(hand_bshd(), 2);
  const LocalShard r0 = s.local(0, 0), r1 = s.local(0, 1);
  EXPECT_EQ(r1.layout.padded_len, 6);
  EXPECT_EQ(r1.layout.fragments.front().begin, 3);
  expect_equal(r0.input_ids, ints({11, 12, 13}), "ids r0");
  expect_equal(r1.input_ids, ints({14, 15, 0}), "ids r1");
  expect_equal(r1.labels, ints({3, 0, -100}), "labels r1");
  expect_equal(r1.position_ids, ints({3, 4, 5}), "positions r1");
  expect_equal(r1.document_ids, ints({1, 1, 0}), "documents r1");
  expect_equal(r1.padding, flags("001"), "padding r1");
  expect_equal(r0.valid, flags("010").flatten(), "valid r0");
  expect_equal(r1.valid, flags("110").flatten(), "valid r1");
}

TEST(OptimizedSharder, HandWorkedThd) {
  const Sharder s = prepare_packed_cp_inputs_for(hand_thd(), 3, 1);
  const LocalShard r1 = s.local(0, 1), r2 = s.local(0, 2);
  expect_equal(s.cu_seqlens(0), at::tensor(std::vector<int64_t>{0, 3, 3, 7}), "cu_seqlens");
  expect_equal(s.cu_seqlens_padded(0), at::tensor(std::vector<int64_t>{0, 4, 5, 9}),
               "cu_seqlens_padded");
  expect_equal(r1.input_ids, ints({104, 105, 106, 107}), "ids r1");
  expect_equal(r2.input_ids, ints({108, 109, 0, 0}), "ids r2");
  expect_equal(r1.document_ids, ints({2, 3, 3, 3}), "documents r1");
  expect_equal(r2.document_ids, ints({3, 0, 0, 0}), "documents r2");
  expect_equal(r1.position_ids, ints({0, 0, 1, 2}), "positions r1");
  expect_equal(r2.position_ids, ints({3, 0, 0, 0}), "positions r2");
  expect_equal(r1.padding, flags("1000"), "padding r1");
  expect_equal(r1.labels, ints({-100, 10, 11, 12}), "labels r1");
  expect_equal(r1.valid, flags("0011").flatten(), "valid r1");
  expect_equal(r2.valid, flags("1000").flatten(), "valid r2");
}

TEST(OptimizedSharder, PositionsAndMaskFromTheGlobalRow) {
  CPBatch b;
  b.input_ids = at::arange(10, 20, at::kLong).reshape({2, 5});
  b.labels = at::ones({2, 5}, at::kLong);
  b.position_ids = (at::arange(5, at::kLong) + 40).unsqueeze(0).repeat({2, 1});
  b.attention_mask = at::ones({2, 5}, at::kLong);
  b.attention_mask[1][0] = 0;
  const Sharder s = prepare_cp_inputs_for(b, 4, /*num_chunks=*/2, true, {.pad_multiple = 2});
  EXPECT_EQ(s.num_microbatches(), 2);
  EXPECT_EQ(s.layout(0, 0).padded_len, 8);  // multiple of CP * pad_multiple = 8
  const LocalShard last = s.local(0, 2);    // global columns 4, 5
  expect_equal(last.position_ids, ints({44, 45}), "positions continue past the end");
  expect_equal(last.padding, flags("01"), "right padding");
  const LocalShard first_mb1 = s.local(1, 0);
  expect_equal(first_mb1.padding, flags("10"), "attention_mask 0 is padding");
  expect_equal(first_mb1.labels, ints({-100, 1}), "padding label");
  expect_equal(first_mb1.input_ids, ints({15, 16}), "second microbatch rows");
}

TEST(OptimizedSharder, ShardPrimaryFalseCutEqualsEagerShard) {
  for (const bool packed : {false, true}) {
    CPBatch b = packed ? hand_thd() : hand_bshd();
    at::manual_seed(3);
    b.inputs_embeds = at::randn({1, b.labels.size(1), 4});
    b.input_ids = at::Tensor();
    const int cp = 3;
    const Sharder eager = packed ? prepare_packed_cp_inputs_for(b, cp, 1, true)
                                 : prepare_cp_inputs_for(b, cp, 1, true);
    const Sharder lazy = packed ? prepare_packed_cp_inputs_for(b, cp, 1, false)
                                : prepare_cp_inputs_for(b, cp, 1, false);
    for (int r = 0; r < cp; ++r) {
      const LocalShard l = lazy.local(0, r);
      EXPECT_FALSE(l.inputs_embeds.defined());
      const at::Tensor spliced = lazy.global_primary(0).clone().requires_grad_(true);
      const at::Tensor cut = lazy.cut_spliced(0, r, spliced);
      expect_equal(cut, eager.local(0, r).inputs_embeds, "in-forward cut");
      expect_equal(l.labels, eager.local(0, r).labels, "labels");
      expect_equal(l.valid, eager.local(0, r).valid, "valid");
      // Gradient lands on this rank's own rows only.
      (cut * (r + 1.0)).sum().backward();
      const Layout lay = lazy.layout(0, r);
      for (int64_t t = 0; t < spliced.size(1); ++t) {
        const double expected =
            t >= lay.fragments.front().begin && t < lay.fragments.back().end ? r + 1.0 : 0.0;
        EXPECT_TRUE(spliced.grad()[0][t].eq(expected).all().item<bool>()) << "t " << t;
      }
    }
  }
}

TEST(OptimizedSharder, FromMapFillsEveryField) {
  std::unordered_map<std::string, c10::IValue> m;
  m["input_ids"] = ints({1, 2, 3});
  m["labels"] = ints({1, 2, 3});
  m["seq_lens"] = ints({3});
  m["seq_lens_padded"] = ints({3});
  m["images"] = std::vector<at::Tensor>{at::zeros({3, 2, 2})};
  m["qkv_format"] = std::string("thd");
  const CPBatch b = CPBatch::from_map(m);
  EXPECT_EQ(b.qkv_format, "thd");
  EXPECT_EQ(b.images.size(), 1u);
  const Sharder s = prepare_packed_cp_inputs_for(b, 2, 1);
  EXPECT_EQ(s.images()[0].sizes(), at::IntArrayRef({3, 2, 2}));
  m["colour"] = ints({1});
  EXPECT_THROW(CPBatch::from_map(m), Error);
}

}  // namespace
}  // namespace cpkit
