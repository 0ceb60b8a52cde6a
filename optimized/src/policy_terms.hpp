// policy_loss's per-position arithmetic (internal header): each position's term of J and its
// derivatives by log-probability and entropy, from the formulas of docs/spec.md section 5c,
// as tensor ops on any device (float64; positions that do not count give 0, whatever their
// inputs hold).
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/policy_loss.hpp"

namespace cpkit::detail {

// A range of positions: lp and entropy from the logits pass, the inputs' values there, the
// aggregation weights w (0 where a position does not count), `counts`, and for gspo each
// position's sequence ratio R.
struct PolicyRange {
  at::Tensor lp, entropy, advantages, old_logprobs, ref_logprobs, sampler_logprobs, w, counts;
  at::Tensor sequence_ratio;  // gspo only
};

struct PolicyTerms {
  at::Tensor weighted;  // w * l
  at::Tensor g_lp;      // d J / d lp, less gspo's sequence part (sequence_slope carries it)
  at::Tensor g_ent;     // d J / d entropy
  at::Tensor ratio, clipped, kl;
  at::Tensor sequence_slope;  // gspo: w * d l / d R per position, summed per sequence later
};

PolicyTerms policy_terms(const PolicyRange& range, const PolicyLossOptions& options);

// Raises naming the option for values section 5c refuses, and for inputs a kind needs.
void check_policy_options(const PolicyLossOptions& options);

}  // namespace cpkit::detail
