// policy_loss (docs/spec.md section 5c) written the simple way: every logit in double, each
// position's log-probability and entropy, the RL loss terms and their global aggregation over
// every rank of the DP x CP group, and the chain rule through the head.
#pragma once

#include <string>
#include <vector>

#include "cpkit/reference/layout.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

struct PolicyLossOptions {
  std::string kind = "ppo";  // "ppo", "cispo", "gspo"
  double eps_low = 0.2, eps_high = 0.2;
  double dual_clip = 0.0;  // c > 1: on negative advantages the term is at most -c A
  std::string kl = "k3";   // "k1", "k2", "k3"
  double kl_coef = 0.0;
  double tis_cap = 0.0;  // > 0: the policy term times min(exp(old - sampler), cap)
  double entropy_coef = 0.0;
  std::string aggregation = "token_mean";  // seq_mean_token_mean, seq_mean_token_sum, constant
  double divisor = 0.0;                    // "constant"
  double softcap = 0.0, temperature = 1.0;
  LayoutPositions layout = {};  // as LossOptions::layout; empty: contiguous
  int cp = 1;                   // ranks are listed DP-major: rank d * cp + c
};

// One rank's inputs: hidden [B * L, H]; labels [B, L]; valid [B * L]; the per-position
// values [B * L] (row-major, prediction-aligned); ref / sampler / sequence ids may be empty.
struct PolicyRankInputs {
  FloatMatrix hidden;
  IntMatrix labels;
  BoolVector valid;
  std::vector<double> advantages, old_logprobs, ref_logprobs, sampler_logprobs;
  std::vector<std::int64_t> sequence_ids;
};

struct RankPolicyLoss {
  double loss = 0;  // W * sum over this rank's positions of w * l
  std::vector<double> logprobs, ratio, clipped, kl, entropy;  // [B * L], 0 where none
  // W * d J / d logprob and W * d J / d entropy per position [B * L]: what the gradients
  // below carry through the head (token_logprobs with these upstreams gives them).
  std::vector<double> grad_logprobs, grad_entropy;
  FloatMatrix grad_hidden;  // W * this rank's positions' share of dJ / d hidden, [B * L, H]
  FloatMatrix grad_weight;  // the same for d weight, [V, H]
};

std::vector<RankPolicyLoss> policy_loss(const std::vector<PolicyRankInputs>& ranks,
                                        const FloatMatrix& weight,
                                        const PolicyLossOptions& options);

}  // namespace cpkit::reference
