// policy_loss: an RL policy-gradient loss (PPO / GRPO / DAPO, CISPO, GSPO; KL to a reference,
// truncated importance sampling, an entropy bonus) through the LM head across CP, every
// aggregation's denominator counted over the DP x CP group (docs/spec.md section 5c).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/logits_precision.hpp"

namespace cpkit {

enum class PolicyKind { kPpo, kCispo, kGspo };
enum class KlEstimator { kK1, kK2, kK3 };
enum class PolicyAggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum, kConstant };

// The names the Python API and errors use ("ppo", "k3", "token_mean", ...); raises naming
// `kind`, `kl` or `aggregation` for any other.
PolicyKind parse_policy_kind(const std::string& name);
KlEstimator parse_kl_estimator(const std::string& name);
PolicyAggregation parse_policy_aggregation(const std::string& name);

// [B, L] per position, prediction-aligned like token_logprobs' output (position j: the value
// of predicting its target); float32 on hidden's device, except sequence_ids (int64).
struct PolicyLossInputs {
  at::Tensor advantages;
  at::Tensor old_logprobs;
  at::Tensor ref_logprobs;      // needed when kl_coef > 0
  at::Tensor sampler_logprobs;  // needed when tis_cap > 0
  at::Tensor sequence_ids;      // the shard's document_ids: gspo and the seq_* aggregations
};

struct PolicyLossOptions {
  PolicyKind kind = PolicyKind::kPpo;
  double eps_low = 0.2, eps_high = 0.2;  // clip(r, 1 - eps_low, 1 + eps_high)
  double dual_clip = 0.0;                // c > 1: on negative advantages the term is <= -c A
  KlEstimator kl = KlEstimator::kK3;
  double kl_coef = 0.0;
  double tis_cap = 0.0;  // > 0: the policy term times min(exp(old - sampler), cap)
  double entropy_coef = 0.0;
  bool entropy = false;  // return each position's entropy (computed anyway when entropy_coef != 0)
  PolicyAggregation aggregation = PolicyAggregation::kTokenMean;
  double divisor = 0.0;  // kConstant: J = sum of terms / divisor
  double softcap = 0.0, temperature = 1.0;
  LogitsPrecision logits_precision = LogitsPrecision::kFp32;
  int64_t chunk_rows = 0;  // token rows per chunk; 0: default_logprob_chunk_rows
  std::shared_ptr<const LayoutPlan> layout = nullptr;  // as in LossOptions; none: contiguous
  MeshPtr dp_mesh = nullptr;                           // the DP group the counts span (none: 1)
};

struct PolicyLoss {
  at::Tensor loss;  // 0-d float32: CP * DP * this rank's share of J (FSDP's mean is J)
  // [B, L] float32, 0 where a position has no target: for logging. entropy is 0 everywhere
  // unless asked for (options.entropy) or used (entropy_coef != 0).
  at::Tensor logprobs, ratio, clipped, kl, entropy;
};

// hidden [B, L, H], weight [V, H], labels, valid and mesh as in shifted_cp_linear_loss.
// Differentiable in hidden and weight: each rank's gradients are CP * DP times its positions'
// share of dJ (for gspo not the derivative of its own loss value; spec 5c). Three GEMMs for
// the token-level kinds (the gradient is formed in the logits pass), four for gspo.
PolicyLoss policy_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                       const at::Tensor& valid, const MeshPtr& mesh, const PolicyLossInputs& inputs,
                       const PolicyLossOptions& options);

// The same without autograd, with the gradients asked for (the Python op's halves).
struct PolicyLossWithGrad {
  PolicyLoss values;
  at::Tensor grad_hidden;  // [B, L, H], hidden's dtype; undefined when not asked for
  at::Tensor grad_weight;  // [V, H], weight's dtype; undefined when not asked for
};
PolicyLossWithGrad policy_loss_with_grad(const at::Tensor& hidden, const at::Tensor& weight,
                                         const at::Tensor& labels, const at::Tensor& valid,
                                         const MeshPtr& mesh, const PolicyLossInputs& inputs,
                                         const PolicyLossOptions& options, LinearLossGrads want);

}  // namespace cpkit
