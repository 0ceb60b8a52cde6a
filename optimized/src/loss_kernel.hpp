// The fused cross-entropy kernel on LibTorch tensors and the scalings around it (internal
// header), shared by shifted_cp_loss and shifted_cp_linear_loss.
#pragma once

#include <ATen/core/Tensor.h>

namespace cpkit::detail {

// Runs the kernel on fp32 `logits` [rows, V] (contiguous) with `targets` [rows] and the
// global `count`: writes d(CP / N * CE) / d logits into `grad` (which may be `logits`
// itself), the unscaled CE of each row into `row_loss` [rows] and CP / N into `scale` [1].
void cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets,
                        const at::Tensor& count, int64_t cp, double softcap, const at::Tensor& grad,
                        const at::Tensor& row_loss, const at::Tensor& scale);

// The loss: a fixed-order double sum of row_loss (the same bits for any thread count or
// chunking) times the kernel's scale, as a 0-d float32 tensor.
at::Tensor scaled_loss(const at::Tensor& row_loss, const at::Tensor& scale);

// grad * upstream, or grad itself when the upstream is a CPU scalar exactly 1 (the usual
// loss.backward()): no pass over a gradient the kernel already scaled. For gradients small
// next to the logits (the fused head's d hidden and d weight).
at::Tensor times_upstream(const at::Tensor& grad, const at::Tensor& upstream);

// grad *= upstream in place for the fp32 contiguous logits gradient: no second [T, V]
// buffer, no pass at all when the upstream is exactly 1, and a CUDA upstream is read on the
// device (no host synchronisation). Arguments checked by the caller (scale_loss_gradient_).
void scale_by_upstream_in_place(const at::Tensor& grad, const at::Tensor& upstream);

}  // namespace cpkit::detail
