// Which token is a loss target (docs/spec.md sections 2 and 3), for the per-token host and
// device loops. targets.hpp holds the same rule for whole tensors.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpkit/optimized/constants.hpp"
#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// `offset` is the token's index within its document (BSHD: the global column, the row being
// one document): offset 0 is predicted by nothing in its document, so it never counts.
CPKIT_HOST_DEVICE inline bool is_valid_target(bool padding, std::int64_t label,
                                              std::int64_t offset) {
  return !padding && label != kIgnoreLabel && offset > 0;
}

// A target the kernels can read: a class of the vocabulary. Anything else that reaches a
// kernel (value checks off) makes its row's loss and gradient NaN rather than a stray read.
CPKIT_HOST_DEVICE inline bool in_vocabulary(std::int64_t target, std::int64_t vocab) {
  return target >= 0 && target < vocab;
}

// Whether a row's target is one the kernels read; else every value and gradient of the row
// is without_target: 0 for no target, NaN for a target outside the vocabulary.
CPKIT_HOST_DEVICE inline bool reads_target(std::int64_t target, std::int64_t vocab) {
  return target != kIgnoreLabel && in_vocabulary(target, vocab);
}
CPKIT_HOST_DEVICE inline float without_target(std::int64_t target) {
  return target == kIgnoreLabel ? 0.0f : NAN;
}

// Padding tokens carry the ignore label in the sharded labels.
CPKIT_HOST_DEVICE inline std::int64_t sharded_label(bool padding, std::int64_t label) {
  return padding ? kIgnoreLabel : label;
}

}  // namespace cpkit::kernels
