// shifted_cp_linear_loss against the materialised path it replaces (hidden @ weight^T, then
// shifted_cp_loss, LibTorch autograd through the matmul) over real Gloo rank processes; the
// default chunk rule; only the asked-for gradients; no [B, L, V] allocation, ever.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "cpkit/optimized/host_cache.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "largest_allocation.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using testing::expect_all_ranks_ok;
using testing::require_close;
using testing::run_ranks;

struct Head {
  at::Tensor hidden, weight, labels, valid;  // this rank's [B, L, H] and [B, L]; [V, H]
};

// A rank's slice of one global batch [B, CP * L], some labels ignored.
Head make_head(int cp, int rank, int64_t B, int64_t L, int64_t H, int64_t V, at::ScalarType dtype) {
  at::manual_seed(31);
  const at::Tensor hidden = at::randn({B, cp * L, H});
  const at::Tensor weight = at::randn({V, H}) * (3.0 / std::sqrt(static_cast<double>(H)));
  at::Tensor labels = at::randint(0, V, {B, cp * L}, at::kLong);
  labels.masked_fill_(at::rand({B, cp * L}) < 0.2, -100);
  Head h;
  h.hidden = hidden.narrow(1, rank * L, L).contiguous().to(dtype);
  h.weight = weight.to(dtype);
  h.labels = labels.narrow(1, rank * L, L).contiguous();
  h.valid = (h.labels != -100).reshape({-1});
  return h;
}

struct Result {
  at::Tensor loss, dhidden, dweight;
};

Result fused(const Head& h, const MeshPtr& mesh, LinearLossOptions options) {
  const at::Tensor x = h.hidden.detach().requires_grad_(true);
  const at::Tensor w = h.weight.detach().requires_grad_(true);
  const at::Tensor loss = shifted_cp_linear_loss(x, w, h.labels, h.valid, mesh, options);
  loss.backward();
  return {loss.detach(), x.grad(), w.grad()};
}

// The path the fused op replaces: the whole [B, L, V] logits, then the loss.
Result materialised(const Head& h, const MeshPtr& mesh, double softcap) {
  const at::Tensor x = h.hidden.detach().requires_grad_(true);
  const at::Tensor w = h.weight.detach().requires_grad_(true);
  const at::Tensor logits = at::matmul(x, w.t()).to(at::kFloat).contiguous();
  const at::Tensor loss = shifted_cp_loss(logits, h.labels, h.valid, mesh, {.softcap = softcap});
  loss.backward();
  return {loss.detach(), x.grad(), w.grad()};
}

void check_rank(int rank, const MeshPtr& mesh, at::ScalarType dtype, double softcap,
                int64_t chunk_rows) {
  const Head h = make_head(cp_size(mesh), rank, 2, 9, 24, 301, dtype);
  LinearLossOptions options;
  options.softcap = softcap;
  options.chunk_rows = chunk_rows;
  const Result got = fused(h, mesh, options), want = materialised(h, mesh, softcap);
  const bool fp32 = dtype == at::kFloat;
  // fp32: the same kernel on logits from differently blocked matmuls. bf16: both paths take
  // bf16 logits, but d hidden rounds the logit gradient to bf16 first (the fused path) or
  // not (autograd of the matmul), and bf16 has 8 significant bits.
  const double tol = fp32 ? 1e-5 : 2e-2;
  require_close(got.loss.reshape({1}), want.loss.reshape({1}), tol, tol, "loss");
  require_close(got.dhidden.to(at::kFloat), want.dhidden.to(at::kFloat), tol, tol, "d hidden");
  require_close(got.dweight.to(at::kFloat), want.dweight.to(at::kFloat), tol, tol, "d weight");
  ranks::require(got.dhidden.scalar_type() == dtype && got.dweight.scalar_type() == dtype,
                 "gradients in the inputs' dtype");
}

CPKIT_TEST_AT_CP_SIZES(LinearLossTest, EqualsTheMaterialisedPath, 1, 2, 3) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    for (const int64_t chunk : {0, 1, 7, 18}) check_rank(rank, mesh, at::kFloat, 0.0, chunk);
    check_rank(rank, mesh, at::kFloat, 5.0, 4);
  }));
}

CPKIT_TEST_AT_CP_SIZES(LinearLossTest, Bfloat16EqualsTheMaterialisedPath, 1, 2, 3) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    check_rank(rank, mesh, at::kBFloat16, 0.0, 5);
    check_rank(rank, mesh, at::kBFloat16, 30.0, 0);
  }));
}

TEST(LinearLossChunks, DefaultFollowsTheBudget) {
  // The SFT loss: 128 MiB of fp32 logits and <= 512 rows on CPU, 1 GiB on CUDA, rounded down
  // to 64 rows.
  EXPECT_EQ(default_linear_loss_chunk_rows(65536, 1 << 20, false), 512);       // 512 rows fit
  EXPECT_EQ(default_linear_loss_chunk_rows(131072, 1 << 20, false), 256);      // 256 rows fit
  EXPECT_EQ(default_linear_loss_chunk_rows(204800, 1 << 20, false), 128);      // 163 -> 128
  EXPECT_EQ(default_linear_loss_chunk_rows(1 << 20, 1 << 20, false), 32);      // < 64: exact
  EXPECT_EQ(default_linear_loss_chunk_rows(204800, 1 << 20, true), 1280);      // 1310 -> 1280
  EXPECT_EQ(default_linear_loss_chunk_rows(32000, 100, false), 100);           // never past rows
  EXPECT_EQ(default_linear_loss_chunk_rows(int64_t{1} << 27, 100, false), 1);  // 0 rows fit
  // token_logprobs and policy_loss: 256 MiB on CPU, the same on CUDA.
  EXPECT_EQ(default_logprob_chunk_rows(65536, 1 << 20, false), 512);   // 1024 -> cap 512
  EXPECT_EQ(default_logprob_chunk_rows(131072, 1 << 20, false), 512);  // 512 rows fit
  EXPECT_EQ(default_logprob_chunk_rows(204800, 1 << 20, false), 320);  // 327 -> 320
  EXPECT_EQ(default_logprob_chunk_rows(1 << 20, 1 << 20, false), 64);  // 64 rows fit
  EXPECT_EQ(default_logprob_chunk_rows(204800, 1 << 20, true), 1280);  // 1310 -> 1280
}

// A frozen head (or frozen hidden states) gets no gradient, and its matmul is not done.
TEST(LinearLossGradients, OnlyWhatIsAskedFor) {
  const Head h = make_head(1, 0, 1, 6, 8, 17, at::kFloat);
  const at::Tensor x = h.hidden.clone().requires_grad_(true);
  shifted_cp_linear_loss(x, h.weight, h.labels, h.valid, nullptr).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(h.weight.grad().defined());
  const auto only_weight = shifted_cp_linear_loss_with_grad(h.hidden, h.weight, h.labels, h.valid,
                                                            nullptr, {}, {.hidden = false});
  EXPECT_FALSE(only_weight.grad_hidden.defined());
  ASSERT_TRUE(only_weight.grad_weight.defined());
  EXPECT_TRUE(
      at::allclose(only_weight.grad_weight, materialised(h, nullptr, 0).dweight, 1e-5, 1e-6));
}

// The point of the op: with B * L = 4096 rows, V = 1000 and 64-row chunks, no allocation may
// come near the [B, L, V] logits (16 MB); the largest is the chunk (256 KB) or the head's
// gradient [V, H].
TEST(LinearLossMemory, NeverAllocatesTheLogits) {
  const Head h = make_head(1, 0, 2, 2048, 16, 1000, at::kFloat);
  const at::Tensor x = h.hidden.clone().requires_grad_(true);
  const at::Tensor w = h.weight.clone().requires_grad_(true);
  LinearLossOptions options;
  options.chunk_rows = 64;
  set_host_cache_limit(0);
  c10::Allocator* inner = c10::GetCPUAllocator();
  testing::LargestAllocation probe(inner);
  c10::SetCPUAllocator(&probe, /*priority=*/100);
  shifted_cp_linear_loss(x, w, h.labels, h.valid, nullptr, options).backward();
  c10::SetCPUAllocator(inner, /*priority=*/101);
  const size_t chunk_bytes = 64 * 1000 * sizeof(float);
  const size_t head_bytes = static_cast<size_t>(w.numel()) * sizeof(float);
  const size_t hidden_bytes = static_cast<size_t>(x.numel()) * sizeof(float);
  EXPECT_LE(probe.largest.load(), std::max({chunk_bytes, head_bytes, hidden_bytes}));
  EXPECT_GT(probe.largest.load(), 0u);  // the probe saw the call's allocations
}

}  // namespace
}  // namespace cpkit
