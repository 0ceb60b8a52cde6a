// cp_attention's CUDA kernels (CP 1) against its CPU kernels, which the CPU tests hold to
// dense attention in double and the reference: values, log-sum-exp and all four gradients
// on a packed row, with GQA, windows, soft cap and sinks, at head sizes that are and are not
// a multiple of the warp's 32 lanes, and bfloat16 inputs (torch's flash kernels where they
// take them).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <string>

#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit {
namespace {

const at::Device kCuda(at::kCUDA, 0);

// One packed row of 300 tokens: documents 37, 0, 101 (slot 104), 60, and a tail.
Sharder packed_row() {
  CPBatch b;
  b.input_ids = at::ones({1, 300}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(std::vector<int64_t>{37, 0, 101, 60}).unsqueeze(0);
  b.seq_lens_padded = at::tensor(std::vector<int64_t>{37, 0, 104, 60}).unsqueeze(0);
  b.qkv_format = "thd";
  return prepare_packed_cp_inputs_for(b, 1, 1);
}

struct Result {
  at::Tensor out, lse, dq, dk, dv, dsinks;
};

Result run(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& g0,
           const at::Tensor& sinks0, const std::shared_ptr<const AttentionPlan>& plan,
           double softcap, at::Device device) {
  const at::Tensor q = q0.to(device).requires_grad_(true);
  const at::Tensor k = k0.to(device).requires_grad_(true);
  const at::Tensor v = v0.to(device).requires_grad_(true);
  CpAttentionOptions o{0.0, softcap, at::Tensor()};
  std::vector<at::Tensor> inputs{q, k, v};
  if (sinks0.defined()) {
    o.sinks = sinks0.to(device).requires_grad_(true);
    inputs.push_back(o.sinks);
  }
  const CpAttentionOutput r = cp_attention(q, k, v, plan, nullptr, o);
  const auto grads = torch::autograd::grad({r.out}, inputs, {g0.to(device)});
  return {r.out.detach().cpu().to(at::kFloat), r.lse.cpu(),
          grads[0].cpu().to(at::kFloat),       grads[1].cpu().to(at::kFloat),
          grads[2].cpu().to(at::kFloat),       sinks0.defined() ? grads[3].cpu() : at::Tensor()};
}

void expect_close(const at::Tensor& gpu, const at::Tensor& cpu, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(gpu.sizes(), cpu.sizes()) << what;
  EXPECT_FALSE(gpu.isnan().any().item<bool>()) << what << " has NaN";
  // -inf log-sum-exps (nothing seen) must match exactly; every other value within tolerance.
  EXPECT_TRUE(at::equal(gpu.isinf(), cpu.isinf())) << what << ": infinities differ";
  const at::Tensor finite = cpu.isfinite();
  const double err =
      (gpu.masked_select(finite) - cpu.masked_select(finite)).abs().max().item<double>();
  const double scale = cpu.masked_select(finite).abs().max().item<double>();
  EXPECT_LE(err, tolerance * (1.0 + scale)) << what << ": max difference " << err;
}

TEST(CudaCpAttention, EqualsCpu) {
  const Sharder s = packed_row();
  for (const int64_t d : {40, 128})
    for (const int64_t window : {0, 17})
      for (const double softcap : {0.0, 20.0})
        for (const bool with_sinks : {false, true}) {
          SCOPED_TRACE("D " + std::to_string(d) + ", window " + std::to_string(window) +
                       ", softcap " + std::to_string(softcap) + ", sinks " +
                       std::to_string(with_sinks));
          at::manual_seed(d + window);
          const int64_t T = 300, hq = 8, hkv = 2;
          const at::Tensor q = at::randn({1, T, hq, d}), k = at::randn({1, T, hkv, d});
          const at::Tensor v = at::randn({1, T, hkv, d}), g = at::randn({1, T, hq, d});
          const at::Tensor sinks = with_sinks ? at::randn({hq}) : at::Tensor();
          const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0, window));
          const Result cpu = run(q, k, v, g, sinks, plan, softcap, at::kCPU);
          const Result gpu = run(q, k, v, g, sinks, plan, softcap, kCuda);
          expect_close(gpu.out, cpu.out, 1e-5, "out");
          expect_close(gpu.lse, cpu.lse, 1e-5, "lse");
          expect_close(gpu.dq, cpu.dq, 1e-4, "dq");
          expect_close(gpu.dk, cpu.dk, 1e-4, "dk");
          expect_close(gpu.dv, cpu.dv, 1e-4, "dv");
          if (with_sinks) expect_close(gpu.dsinks, cpu.dsinks, 1e-4, "dsinks");
        }
}

// bfloat16 without a soft cap or sinks runs on torch's flash kernels (D 64 and 128, GQA,
// with and without a window); D 40 is not a multiple of 8 and stays on cpkit's kernels.
TEST(CudaCpAttention, BFloat16EqualsCpu) {
  const Sharder s = packed_row();
  for (const int64_t d : {40, 64, 128})
    for (const int64_t window : {0, 17}) {
      SCOPED_TRACE("D " + std::to_string(d) + ", window " + std::to_string(window));
      at::manual_seed(3 + d + window);
      const int64_t T = 300, hq = 8, hkv = 2;
      auto input = [&](int64_t heads) { return at::randn({1, T, heads, d}).to(at::kBFloat16); };
      const at::Tensor q = input(hq), k = input(hkv), v = input(hkv), g = input(hq);
      const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0, window));
      const Result cpu = run(q, k, v, g, at::Tensor(), plan, 0.0, at::kCPU);
      const Result gpu = run(q, k, v, g, at::Tensor(), plan, 0.0, kCuda);
      // Both read the same bfloat16 inputs; the outputs round to bfloat16, and flash
      // multiplies probabilities by values in bfloat16.
      expect_close(gpu.out, cpu.out, 1e-2, "out");
      expect_close(gpu.lse, cpu.lse, 1e-3, "lse");
      expect_close(gpu.dq, cpu.dq, 2e-2, "dq");
      expect_close(gpu.dk, cpu.dk, 2e-2, "dk");
      expect_close(gpu.dv, cpu.dv, 2e-2, "dv");
    }
}

TEST(CudaCpAttention, HeadSizeOverTheKernelsLimitRaisesNamingIt) {
  const Sharder s = packed_row();
  const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, 0, 0));
  const at::Tensor q = at::randn({1, 300, 2, 264}, kCuda);
  try {
    (void)cp_attention(q, q, q, plan, nullptr);
    FAIL() << "D = 264 on CUDA was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
    EXPECT_NE(std::string(e.what()).find("D = 264"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cpkit
