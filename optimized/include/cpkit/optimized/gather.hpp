// gather_tokens on LibTorch tensors (docs/spec.md section 4).
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// [N, ...] on every rank -> [CP * N, ...] in rank order. Differentiable: backward is one
// reduce-scatter SUM onto the owning rank. Counts or trailing shapes that differ across
// ranks raise cpkit::Error on every rank.
at::Tensor gather_tokens(const at::Tensor& value, const MeshPtr& mesh, bool differentiable);

// gather_tokens' backward: [CP * N, ...] -> [N, ...], the sum over ranks of every rank's rows
// [rank * N, (rank + 1) * N) (one reduce-scatter SUM). For autograd systems that register the
// backward themselves (the Python package); gather_tokens(..., true) already uses it.
at::Tensor reduce_scatter_tokens(const at::Tensor& grad, const MeshPtr& mesh);

}  // namespace cpkit
