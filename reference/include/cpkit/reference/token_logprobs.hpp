// token_logprobs (docs/spec.md section 5b) written the simple way: every logit in double,
// log-softmax and entropy per position, the chain rule through the head for given upstreams.
#pragma once

#include "cpkit/reference/layout.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

struct TokenLogprobsOptions {
  double softcap = 0.0;         // > 0: c * tanh(z / c) first
  double temperature = 1.0;     // then z / t
  LayoutPositions layout = {};  // as LossOptions::layout; empty: contiguous
};

struct RankTokenLogprobs {
  std::vector<double> logprobs;  // [B * L], 0 where there is no target
  std::vector<double> entropy;   // [B * L], 0 where there is no target
  std::vector<bool> has_target;  // [B * L]
  FloatMatrix grad_hidden;       // d(sum g_lp logprob + g_ent entropy) / d hidden, [B * L, H]
  FloatMatrix grad_weight;       // the same / d weight, [V, H]: this rank's positions only
};

// hidden[r] [B * L, H], weight [V, H], labels[r] [B, L], valid[r] [B * L] as for
// shifted_cp_linear_loss; grad_logprobs[r] and grad_entropy[r] [B * L]: the upstreams.
std::vector<RankTokenLogprobs> token_logprobs(const std::vector<FloatMatrix>& hidden,
                                              const FloatMatrix& weight,
                                              const std::vector<IntMatrix>& labels,
                                              const std::vector<BoolVector>& valid,
                                              const std::vector<std::vector<double>>& grad_logprobs,
                                              const std::vector<std::vector<double>>& grad_entropy,
                                              const TokenLogprobsOptions& options = {});

}  // namespace cpkit::reference
