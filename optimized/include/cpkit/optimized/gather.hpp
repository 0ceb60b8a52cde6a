// gather_tokens on LibTorch tensors (docs/spec.md section 4).
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit {

// [N, ...] on every rank -> [CP * N, ...] in rank order, along `dim` (default 0, negative
// counts from the end: an attention layer's [B, H, S, D] keys gather along dim 2 with no
// permute). Differentiable: backward is one reduce-scatter SUM onto the owning rank along
// the same dim. Shapes or dtypes that differ across ranks raise cpkit::Error on every rank.
// A contiguous input is sent as it is; for dim != 0 the result is assembled in one copy.
at::Tensor gather_tokens(const at::Tensor& value, const MeshPtr& mesh, bool differentiable,
                         int64_t dim = 0);

// gather_tokens' backward: [.., CP * N, ..] -> [.., N, ..] along `dim`, the sum over ranks of
// every rank's slice [rank * N, (rank + 1) * N) (one reduce-scatter SUM). For autograd
// systems that register the backward themselves (the Python package); gather_tokens(...,
// true) already uses it.
at::Tensor reduce_scatter_tokens(const at::Tensor& grad, const MeshPtr& mesh, int64_t dim = 0);

// Per-token values of this rank's shard [rows, L, ...] (local order, e.g. per-token losses or
// log-probabilities) -> [rows, S_pad, ...] in global order, on every rank: gather_tokens
// along the token axis, then the layout's inverse permutation. Differentiable (the gradient of
// a rank's own tokens, summed over the ranks that used them).
at::Tensor restore_order(const at::Tensor& local, const Layout& layout, const MeshPtr& mesh);

// restore_order's permutation (layout.hpp's restore_index) as an int64 tensor on `device`,
// uploaded once per plan and device and then reused (no host-to-device copy per call).
at::Tensor restore_index_tensor(const LayoutPlan& plan, const at::Device& device);

// Raises naming `local` unless it is [rows, plan.local_len, ...]: restore_order's check, for
// front doors that gather themselves (the Python package).
void check_restore_input(const at::Tensor& local, const LayoutPlan& plan);

}  // namespace cpkit
