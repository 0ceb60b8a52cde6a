// cp_attention in one process (CP 1) against attention written in ATen ops in double (a
// dense document-causal mask with the window, GQA by repeating heads, soft cap, sinks as an
// extra column), values and gradients; and its bad inputs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <memory>

#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "expect_rejected.hpp"

namespace cpkit {
namespace {

// A packed row of documents 5, 0, 9, 3 (slot padding 1 on the third) and a row tail of 2.
Sharder packed_row() {
  CPBatch b;
  b.input_ids = at::ones({1, 20}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(std::vector<int64_t>{5, 0, 9, 3}).unsqueeze(0);
  b.seq_lens_padded = at::tensor(std::vector<int64_t>{5, 0, 10, 3}).unsqueeze(0);
  b.qkv_format = "thd";
  return prepare_packed_cp_inputs_for(b, 1, 1);
}

struct Truth {
  at::Tensor out, lse;
};

// Attention over [T, H, D] in double with section 3's mask, the window, soft cap and sinks.
Truth truth(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const LocalShard& l,
            int64_t window, double scale, double softcap, const at::Tensor& sinks) {
  const at::Tensor pos = l.position_ids[0], doc = l.document_ids[0], pad = l.padding[0];
  at::Tensor visible = (doc.unsqueeze(1) > 0) & (doc.unsqueeze(1) == doc.unsqueeze(0)) &
                       (pos.unsqueeze(0) <= pos.unsqueeze(1)) & (~pad).unsqueeze(0);
  if (window > 0) visible = visible & (pos.unsqueeze(1) - pos.unsqueeze(0) < window);
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor kk = k.repeat_interleave(group, 1), vv = v.repeat_interleave(group, 1);
  at::Tensor s = at::einsum("ihd,jhd->hij", {q, kk}) * scale;  // [H, T, T]
  if (softcap > 0) s = softcap * at::tanh(s / softcap);
  s = s.masked_fill(~visible.unsqueeze(0), -INFINITY);
  if (sinks.defined())
    s = at::cat({s, sinks.view({-1, 1, 1}).expand({s.size(0), s.size(1), 1})}, 2);
  const at::Tensor lse = at::logsumexp(s, 2);  // [H, T]
  at::Tensor p = at::exp(s - lse.unsqueeze(2)).nan_to_num(0.0);
  if (sinks.defined()) p = p.narrow(2, 0, s.size(2) - 1);
  return {at::einsum("hij,jhd->ihd", {p, vv}), lse};
}

TEST(CpAttention, OneRankEqualsDenseAttentionInDouble) {
  const Sharder s = packed_row();
  const LocalShard l = s.local(0);
  for (const int64_t window : {0, 3})
    for (const double softcap : {0.0, 1.5})
      for (const bool with_sinks : {false, true}) {
        SCOPED_TRACE("window " + std::to_string(window) + ", softcap " + std::to_string(softcap) +
                     ", sinks " + std::to_string(with_sinks));
        at::manual_seed(7);
        const int64_t T = 20, hq = 4, hkv = 2, d = 3;
        const at::Tensor q = at::randn({1, T, hq, d}, at::kFloat).requires_grad_(true);
        const at::Tensor k = at::randn({1, T, hkv, d}, at::kFloat).requires_grad_(true);
        const at::Tensor v = at::randn({1, T, hkv, d}, at::kFloat).requires_grad_(true);
        const at::Tensor d_out = at::randn({1, T, hq, d});
        CpAttentionOptions o{0.4, softcap, at::Tensor()};
        if (with_sinks) o.sinks = at::randn({hq}).requires_grad_(true);
        const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0, window));
        const CpAttentionOutput got = cp_attention(q, k, v, plan, nullptr, o);

        const at::Tensor qd = q.detach().to(at::kDouble)[0].requires_grad_(true);
        const at::Tensor kd = k.detach().to(at::kDouble)[0].requires_grad_(true);
        const at::Tensor vd = v.detach().to(at::kDouble)[0].requires_grad_(true);
        const at::Tensor sd =
            with_sinks ? o.sinks.detach().to(at::kDouble).requires_grad_(true) : at::Tensor();
        const Truth want = truth(qd, kd, vd, l, window, 0.4, softcap, sd);
        EXPECT_TRUE(at::allclose(got.out[0].to(at::kDouble), want.out, 1e-5, 1e-5));
        const at::Tensor lse = got.lse[0].to(at::kDouble);
        EXPECT_TRUE(
            at::allclose(lse.nan_to_num(0, 0, 0), want.lse.nan_to_num(0, 0, 0), 1e-5, 1e-5));
        EXPECT_TRUE(at::equal(at::isinf(lse), at::isinf(want.lse)));

        std::vector<at::Tensor> ins{q, k, v}, ins_d{qd, kd, vd};
        if (with_sinks) {
          ins.push_back(o.sinks);
          ins_d.push_back(sd);
        }
        const auto g = torch::autograd::grad({got.out}, ins, {d_out});
        const auto gd = torch::autograd::grad({want.out}, ins_d, {d_out[0].to(at::kDouble)});
        for (std::size_t i = 0; i < g.size(); ++i) {
          const at::Tensor a = (i < 3 ? g[i][0] : g[i]).to(at::kDouble);
          ASSERT_FALSE(a.isnan().any().item<bool>()) << "input " << i;
          EXPECT_TRUE(at::allclose(a, gd[i], 1e-4, 1e-5))
              << "input " << i << ": max diff " << (a - gd[i]).abs().max().item<double>();
        }
      }
}

// Half-precision inputs compute in float32 and round once: the output and d v are exactly the
// float32 op's on the same (rounded) values, rounded to the inputs' dtype; d q and d k read
// the saved output, rounded, so they agree within that rounding.
TEST(CpAttention, HalfPrecisionIsFloat32RoundedOnce) {
  const Sharder s = packed_row();
  const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0, 3));
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(9);
    const int64_t T = 20, hq = 4, hkv = 2, d = 8;
    const at::Tensor q0 = at::randn({1, T, hq, d}).to(dtype),
                     k0 = at::randn({1, T, hkv, d}).to(dtype);
    const at::Tensor v0 = at::randn({1, T, hkv, d}).to(dtype),
                     g0 = at::randn({1, T, hq, d}).to(dtype);
    auto run = [&](at::ScalarType as) {
      const at::Tensor q = q0.to(as).requires_grad_(true), k = k0.to(as).requires_grad_(true);
      const at::Tensor v = v0.to(as).requires_grad_(true);
      const CpAttentionOutput o = cp_attention(q, k, v, plan, nullptr, {0.0, 1.5, at::Tensor()});
      auto grads = torch::autograd::grad({o.out}, {q, k, v}, {g0.to(as)});
      grads.insert(grads.begin(), o.out.detach());
      return grads;
    };
    const auto half = run(dtype), single = run(at::kFloat);
    const double rounding = dtype == at::kHalf ? 1e-3 : 8e-3;
    for (std::size_t i = 0; i < half.size(); ++i) {
      EXPECT_EQ(half[i].scalar_type(), dtype) << "output " << i;
      if (i == 0 || i == 3) {
        EXPECT_TRUE(at::equal(half[i], single[i].to(dtype))) << "output " << i;
      } else {
        const at::Tensor a = half[i].to(at::kFloat), b = single[i];
        ASSERT_FALSE(a.isnan().any().item<bool>()) << "output " << i;
        EXPECT_TRUE(at::allclose(a, b, 2 * rounding, 2 * rounding))
            << "output " << i << ": max diff " << (a - b).abs().max().item<double>();
      }
    }
  }
}

TEST(CpAttention, BadInputsAreNamed) {
  const Sharder s = packed_row();
  const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0));
  const at::Tensor q = at::zeros({1, 20, 4, 3}), kv = at::zeros({1, 20, 2, 3});
  test::expect_rejected<Error>([&] { cp_attention(q, kv, kv, nullptr, nullptr); }, "plan",
                               {"null"});
  test::expect_rejected<Error>(
      [&] {
        cp_attention(q, at::zeros({1, 20, 3, 3}), at::zeros({1, 20, 3, 3}), plan, nullptr);
      },
      "q", {"4 heads", "3"});
  test::expect_rejected<Error>([&] { cp_attention(q.to(at::kDouble), kv, kv, plan, nullptr); }, "q",
                               {"Double"});
  test::expect_rejected<Error>(
      [&] {
        cp_attention(at::zeros({1, 19, 4, 3}), kv, kv, plan, nullptr);
      },
      "k", {"[1, 20, 2, 3]"});
  test::expect_rejected<Error>(
      [&] {
        cp_attention(q, kv, kv, plan, nullptr, {0.0, 0.0, at::zeros({3})});
      },
      "sinks", {"[Hq] = [4]"});
  test::expect_rejected<Error>(
      [&] {
        cp_attention(q, kv, kv, plan, nullptr, {0.0, -1.0, at::Tensor()});
      },
      "softcap", {"-1"});
  test::expect_rejected<Error>([&] { attention_plan(s, 0, 0, -2); }, "window", {"-2"});
  const at::Tensor meta_kv = at::empty({1, 20, 2, 3}, at::kMeta);
  test::expect_rejected<Error>(
      [&] {
        cp_attention(at::empty({1, 20, 4, 3}, at::kMeta), meta_kv, meta_kv, plan, nullptr);
      },
      "q", {"meta", "CPU and CUDA"});
}

}  // namespace
}  // namespace cpkit
