// The target rules of kernels/targets.hpp on whole tensors (any device), for the ATen paths.
// tests/optimized/targets_test.cpp checks both forms agree on every combination.
#pragma once

#include <ATen/ATen.h>

#include "cpkit/optimized/constants.hpp"

namespace cpkit::detail {

// kernels::sharded_label, element-wise.
inline at::Tensor sharded_labels(const at::Tensor& padding, const at::Tensor& labels) {
  return at::where(padding, at::full({}, kIgnoreLabel, labels.options()), labels);
}

// kernels::is_valid_target, element-wise; flattened to the loss's [rows * L] mask.
inline at::Tensor valid_targets(const at::Tensor& padding, const at::Tensor& labels,
                                const at::Tensor& offset) {
  return ((~padding) & (labels != kIgnoreLabel) & (offset > 0)).reshape({-1});
}

}  // namespace cpkit::detail
