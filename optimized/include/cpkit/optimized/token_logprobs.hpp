// token_logprobs: each token's next-token log-probability (and entropy) through the LM head,
// across CP shard boundaries, without a [B, L, V] buffer (docs/spec.md section 5b). For RL
// trainers: the per-token values a policy-gradient loss is built from.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/logits_precision.hpp"

namespace cpkit {

struct TokenLogprobsOptions {
  double softcap = 0.0;      // > 0: the model's c * tanh(z / c) first
  double temperature = 1.0;  // the sampler's: z / t after the cap; finite and > 0
  bool entropy = false;      // also each position's entropy
  LogitsPrecision logits_precision = LogitsPrecision::kFp32;
  int64_t chunk_rows = 0;  // token rows per chunk; 0: default_logprob_chunk_rows
  std::shared_ptr<const LayoutPlan> layout = nullptr;  // as in LossOptions; none: contiguous
};

// The default chunk of token_logprobs and policy_loss: default_linear_loss_chunk_rows' rule
// with 256 MiB of fp32 logits on the CPU (the policy loss's time targets need the larger
// chunk; docs/performance.md).
int64_t default_logprob_chunk_rows(int64_t vocab, int64_t rows, bool cuda);

struct TokenLogprobs {
  at::Tensor logprobs;    // [B, L] float32, 0 where there is no target
  at::Tensor entropy;     // [B, L] float32 when asked for, else undefined
  at::Tensor has_target;  // [B, L] bool
};

// hidden [B, L, H], weight [V, H] (float32 or bfloat16, the same dtype and device), labels
// [B, L] int64 unshifted, valid [B * L] bool: the shard's. Position j's target is
// shifted_cp_loss's (the next global position's label, across ranks). Differentiable in hidden
// and weight for any upstream; the backward recomputes each chunk's logits (no [B, L, V] is
// kept), and d weight is this rank's term (as in shifted_cp_linear_loss).
TokenLogprobs token_logprobs(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& labels, const at::Tensor& valid, const MeshPtr& mesh,
                             const TokenLogprobsOptions& options = {});

// The same as two calls without autograd (the Python op's forward and backward). The
// forward's `targets` and `stats` are what the backward needs besides hidden and weight.
struct TokenLogprobsForward {
  TokenLogprobs values;
  at::Tensor targets;  // [B, L] int64: each position's target class, or -100
  at::Tensor stats;    // [B * L, 3] float32: per position max, log-sum and mean (z - max)
};
TokenLogprobsForward token_logprobs_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& labels, const at::Tensor& valid,
                                            const MeshPtr& mesh,
                                            const TokenLogprobsOptions& options = {});

struct TokenLogprobsGrads {
  at::Tensor hidden;  // [B, L, H], hidden's dtype; undefined when not asked for
  at::Tensor weight;  // [V, H], weight's dtype; undefined when not asked for
};
// grad_logprobs [B, L] and grad_entropy [B, L] are the upstream gradients (each undefined: zero).
TokenLogprobsGrads token_logprobs_backward(const at::Tensor& hidden, const at::Tensor& weight,
                                           const at::Tensor& targets, const at::Tensor& stats,
                                           const at::Tensor& grad_logprobs,
                                           const at::Tensor& grad_entropy,
                                           const TokenLogprobsOptions& options, bool want_hidden,
                                           bool want_weight);

}  // namespace cpkit
