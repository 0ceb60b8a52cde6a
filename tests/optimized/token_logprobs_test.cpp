// token_logprobs against ATen autograd in double on the unsharded batch (CP 1-3 over Gloo
// rank processes), the logits_precision targets for bf16 heads at every chunk size (issue
// 24), no [B, L, V] allocation, only the asked-for gradients, and its argument errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/host_cache.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "largest_allocation.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using testing::expect_all_ranks_ok;
using testing::require_close;
using testing::run_ranks;

// A global batch: hidden [B, S, H], head [V, H] (logits of scale `scale`), labels [B, S]
// with some -100, and the upstreams [B, S] of a policy-gradient objective.
struct Batch {
  at::Tensor hidden, weight, labels, g_lp, g_ent;
};

Batch make_batch(int64_t B, int64_t S, int64_t H, int64_t V, double scale, at::ScalarType dtype) {
  at::manual_seed(7);
  Batch b;
  b.hidden = at::randn({B, S, H}).to(dtype);
  b.weight = (at::randn({V, H}) * (scale / std::sqrt(static_cast<double>(H)))).to(dtype);
  b.labels = at::randint(0, V, {B, S}, at::kLong);
  b.labels.masked_fill_(at::rand({B, S}) < 0.2, -100);
  b.g_lp = at::randn({B, S});
  b.g_ent = at::randn({B, S});
  return b;
}

struct Values {
  at::Tensor logprobs, entropy, has_target, dhidden, dweight;
};

// The truth in double on the same (possibly bf16) values: log_softmax over the whole
// sequence, each position predicting the next label; the objective sum(g_lp lp + g_ent H)
// over positions [begin, end) of every row, differentiated by autograd.
Values truth(const Batch& b, double softcap, double temperature, int64_t begin, int64_t end) {
  const at::Tensor h = b.hidden.to(at::kDouble).requires_grad_(true);
  const at::Tensor w = b.weight.to(at::kDouble).requires_grad_(true);
  at::Tensor z = at::matmul(h, w.t());
  if (softcap > 0) z = softcap * at::tanh(z / softcap);
  z = z / temperature;
  const at::Tensor lsm = at::log_softmax(z, -1);
  at::Tensor targets = at::full_like(b.labels, -100);
  targets.narrow(1, 0, b.labels.size(1) - 1).copy_(b.labels.narrow(1, 1, b.labels.size(1) - 1));
  const at::Tensor has = targets != -100;
  const at::Tensor lp =
      lsm.gather(2, targets.clamp_min(0).unsqueeze(2)).squeeze(2) * has.to(at::kDouble);
  const at::Tensor ent = -(lsm.exp() * lsm).sum(2) * has.to(at::kDouble);
  const int64_t n = end - begin;
  const at::Tensor objective = (lp.narrow(1, begin, n) * b.g_lp.narrow(1, begin, n)).sum() +
                               (ent.narrow(1, begin, n) * b.g_ent.narrow(1, begin, n)).sum();
  const auto grads = torch::autograd::grad({objective}, {h, w});
  return {lp.narrow(1, begin, n).detach(), ent.narrow(1, begin, n).detach(),
          has.narrow(1, begin, n), grads[0].narrow(1, begin, n), grads[1]};
}

// This rank's contiguous cut of the batch, through token_logprobs and autograd.
Values ours(const Batch& b, const MeshPtr& mesh, int64_t begin, int64_t n,
            const TokenLogprobsOptions& options) {
  const at::Tensor h = b.hidden.narrow(1, begin, n).contiguous().requires_grad_(true);
  const at::Tensor w = b.weight.detach().clone().requires_grad_(true);
  const at::Tensor labels = b.labels.narrow(1, begin, n).contiguous();
  const TokenLogprobs r =
      token_logprobs(h, w, labels, (labels != -100).reshape({-1}), mesh, options);
  at::Tensor objective = (r.logprobs * b.g_lp.narrow(1, begin, n)).sum();
  if (options.entropy) objective = objective + (r.entropy * b.g_ent.narrow(1, begin, n)).sum();
  const auto grads = torch::autograd::grad({objective}, {h, w});
  return {r.logprobs, r.entropy, r.has_target, grads[0], grads[1]};
}

CPKIT_TEST_AT_CP_SIZES(TokenLogprobsTest, EqualsDoubleLogSoftmaxOfTheUnshardedBatch, 1, 2, 3) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    const int64_t L = 7;
    const Batch b = make_batch(2, cp_size(mesh) * L, 24, 301, 3.0, at::kFloat);
    for (const double softcap : {0.0, 5.0})
      for (const double temperature : {1.0, 0.7})
        for (const int64_t chunk : {0, 5}) {
          TokenLogprobsOptions options;
          options.softcap = softcap;
          options.temperature = temperature;
          options.entropy = true;
          options.chunk_rows = chunk;
          const Values got = ours(b, mesh, rank * L, L, options);
          const Values want = truth(b, softcap, temperature, rank * L, (rank + 1) * L);
          require_close(got.logprobs, want.logprobs, 2e-5, 1e-5, "logprobs");
          require_close(got.entropy, want.entropy, 2e-5, 1e-5, "entropy");
          ranks::require_equal(got.has_target, want.has_target, "has_target");
          require_close(got.dhidden, want.dhidden, 2e-5, 1e-4, "d hidden");
          require_close(got.dweight, want.dweight, 2e-5, 1e-4, "d weight");
        }
  }));
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want).norm() / want.norm()).item<double>();
}

double max_abs_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>();
}

// Issue 24's targets for a bf16 head under logits_precision fp32, against double on the same
// bf16 values, at 64 to 4096 rows a chunk (1 to 64 chunks): |delta logprob| <= 2e-4 and
// d weight within 2^-8 relative at every chunk size (it is summed in fp32 across chunks, so
// the error does not grow with their number). The bf16-rounded mode misses the first. In a
// rank process, as every test here that runs parallel kernels: OpenMP's pool in the gtest
// process would hang the later tests' forked ranks.
TEST(TokenLogprobsPrecision, Bfloat16InFp32MeetsTheTargetsAtEveryChunkSize) {
  expect_all_ranks_ok(run_ranks(1, [](int, const MeshPtr&) {
    const Batch b = make_batch(1, 4097, 64, 1024, 8.0, at::kBFloat16);
    const Values want = truth(b, 0.0, 1.0, 0, 4097);
    for (const int64_t chunk : {64, 256, 1024, 4096}) {
      TokenLogprobsOptions options;
      options.chunk_rows = chunk;
      options.entropy = true;
      const Values got = ours(b, nullptr, 0, 4097, options);
      const std::string at = " at chunk_rows " + std::to_string(chunk) + ": ";
      const double lp = max_abs_error(got.logprobs, want.logprobs);
      const double ent = max_abs_error(got.entropy, want.entropy);
      const double dw = relative_error(got.dweight, want.dweight);
      const double dh = relative_error(got.dhidden, want.dhidden);
      ranks::require(lp <= 2e-4, "|delta logprob|" + at + std::to_string(lp));
      ranks::require(ent <= 2e-4, "|delta entropy|" + at + std::to_string(ent));
      ranks::require(dw <= std::ldexp(1.0, -8),
                     "d weight relative error" + at + std::to_string(dw));
      ranks::require(dh <= std::ldexp(1.0, -8),
                     "d hidden relative error" + at + std::to_string(dh));
      ranks::require(got.dweight.scalar_type() == at::kBFloat16, "d weight in bf16");
    }
    TokenLogprobsOptions rounded;
    rounded.logits_precision = LogitsPrecision::kInput;
    const double input = max_abs_error(ours(b, nullptr, 0, 4097, rounded).logprobs, want.logprobs);
    ranks::require(input > 2e-4, "bf16 logits within 2e-4: " + std::to_string(input));
  }));
}

// The fused loss gains the same mode: its mean loss within 1e-6 relative of double.
TEST(TokenLogprobsPrecision, LinearLossInFp32MeetsTheLossTarget) {
  expect_all_ranks_ok(run_ranks(1, [](int, const MeshPtr&) {
    const Batch b = make_batch(1, 4097, 64, 1024, 8.0, at::kBFloat16);
    const at::Tensor valid = (b.labels != -100).reshape({-1});
    const Values t = truth(b, 0.0, 1.0, 0, 4097);
    const double want = (-t.logprobs.sum() / t.has_target.sum()).item<double>();
    LinearLossOptions options;
    options.logits_precision = LogitsPrecision::kFp32;
    const double got = shifted_cp_linear_loss(b.hidden, b.weight, b.labels, valid, nullptr, options)
                           .item<double>();
    ranks::require(std::abs(got - want) <= 1e-6 * std::abs(want),
                   "fp32 mode loss " + std::to_string(got) + " vs " + std::to_string(want));
    const double rounded =
        shifted_cp_linear_loss(b.hidden, b.weight, b.labels, valid, nullptr).item<double>();
    ranks::require(std::abs(rounded - want) > 1e-6 * std::abs(want),
                   "the default (bf16 logits) within 1e-6 too: the test shows nothing");
  }));
}

// B * L = 4096 rows, V = 1000, 64-row chunks: no allocation near the [B, L, V] logits (16 MB)
// in the forward or the backward; the largest is a chunk, the head's gradient or hidden's.
TEST(TokenLogprobsMemory, NeverAllocatesTheLogits) {
  expect_all_ranks_ok(run_ranks(1, [](int, const MeshPtr&) {
    const Batch b = make_batch(2, 2048, 16, 1000, 3.0, at::kFloat);
    const at::Tensor x = b.hidden.clone().requires_grad_(true);
    const at::Tensor w = b.weight.clone().requires_grad_(true);
    TokenLogprobsOptions options;
    options.chunk_rows = 64;
    options.entropy = true;
    set_host_cache_limit(0);
    c10::Allocator* inner = c10::GetCPUAllocator();
    testing::LargestAllocation probe(inner);
    c10::SetCPUAllocator(&probe, /*priority=*/100);
    const TokenLogprobs r =
        token_logprobs(x, w, b.labels, (b.labels != -100).reshape({-1}), nullptr, options);
    ((r.logprobs * b.g_lp).sum() + (r.entropy * b.g_ent).sum()).backward();
    c10::SetCPUAllocator(inner, /*priority=*/101);
    const size_t chunk_bytes = 64 * 1000 * sizeof(float);
    const size_t head_bytes = static_cast<size_t>(w.numel()) * sizeof(float);
    const size_t hidden_bytes = static_cast<size_t>(x.numel()) * sizeof(float);
    ranks::require(probe.largest.load() <= std::max({chunk_bytes, head_bytes, hidden_bytes}),
                   "an allocation of " + std::to_string(probe.largest.load()) + " bytes");
    ranks::require(probe.largest.load() > 0, "the probe saw no allocation");
  }));
}

// A frozen head gets no gradient; an entropy not asked for is undefined.
TEST(TokenLogprobsGradients, OnlyWhatIsAskedFor) {
  const Batch b = make_batch(1, 6, 8, 17, 1.0, at::kFloat);
  const at::Tensor x = b.hidden.clone().requires_grad_(true);
  const TokenLogprobs r =
      token_logprobs(x, b.weight, b.labels, (b.labels != -100).reshape({-1}), nullptr);
  EXPECT_FALSE(r.entropy.defined());
  r.logprobs.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(b.weight.grad().defined());
}

// A missing upstream is zero: the backward half without a log-prob upstream, and the C++
// autograd with the entropy alone in the loss (the log-probs' upstream arrives undefined),
// give the gradient of a zero log-prob upstream.
TEST(TokenLogprobsGradients, MissingUpstreamIsZero) {
  const Batch b = make_batch(1, 6, 8, 17, 1.0, at::kFloat);
  const at::Tensor valid = (b.labels != -100).reshape({-1});
  TokenLogprobsOptions options;
  options.entropy = true;
  const TokenLogprobsForward f =
      token_logprobs_forward(b.hidden, b.weight, b.labels, valid, nullptr, options);
  const at::Tensor g_ent = at::randn({1, 6});
  const TokenLogprobsGrads want = token_logprobs_backward(
      b.hidden, b.weight, f.targets, f.stats, at::zeros({1, 6}), g_ent, options, true, true);
  ASSERT_GT(want.hidden.abs().max().item<float>(), 0.0f);
  const TokenLogprobsGrads got = token_logprobs_backward(b.hidden, b.weight, f.targets, f.stats,
                                                         at::Tensor(), g_ent, options, true, true);
  EXPECT_TRUE(at::equal(got.hidden, want.hidden));
  EXPECT_TRUE(at::equal(got.weight, want.weight));
  const at::Tensor x = b.hidden.clone().requires_grad_(true);
  const TokenLogprobs r = token_logprobs(x, b.weight, b.labels, valid, nullptr, options);
  (r.entropy * g_ent).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), want.hidden));
}

// Each bad option names its argument and value.
TEST(TokenLogprobsErrors, NameTheArgument) {
  const Batch b = make_batch(1, 6, 8, 17, 1.0, at::kFloat);
  const at::Tensor valid = (b.labels != -100).reshape({-1});
  auto argument_of = [&](const TokenLogprobsOptions& options) {
    try {
      token_logprobs(b.hidden, b.weight, b.labels, valid, nullptr, options);
    } catch (const Error& e) {
      return e.argument() + ": " + e.what();
    }
    return std::string("no error");
  };
  for (const double t : {0.0, -1.0, double{NAN}, double{INFINITY}}) {
    TokenLogprobsOptions options;
    options.temperature = t;
    EXPECT_EQ(argument_of(options).rfind("temperature: ", 0), 0u) << argument_of(options);
  }
  TokenLogprobsOptions capped;
  capped.softcap = -1;
  EXPECT_EQ(argument_of(capped).rfind("softcap: ", 0), 0u);
  try {
    parse_logits_precision("fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "logits_precision");
    EXPECT_NE(std::string(e.what()).find("\"fp16\""), std::string::npos) << e.what();
  }
  const TokenLogprobsForward f = token_logprobs_forward(b.hidden, b.weight, b.labels, valid, {});
  try {
    token_logprobs_backward(b.hidden, b.weight, f.targets, f.stats, at::ones({1, 5}), {}, {}, true,
                            true);
    ADD_FAILURE() << "a [1, 5] upstream accepted for [1, 6] positions";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "grad_logprobs");
  }
}

}  // namespace
}  // namespace cpkit
