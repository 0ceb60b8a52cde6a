// shifted_cp_loss on LibTorch tensors (docs/spec.md section 5).
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"

#include <memory>

namespace cpkit {

struct LossOptions {
  double softcap = 0.0;  // > 0: apply c * tanh(z / c) (and its chain rule) inside the kernel
  // The layout the shards were cut with (Sharder::layout(m).plan); none: contiguous. It tells
  // where each fragment's next token lives (docs/spec.md section 5).
  std::shared_ptr<const LayoutPlan> layout = nullptr;
};

// HF shifted CE across shard boundaries. logits [B, L, V] float32, labels [B, L] int64
// unshifted, valid [B * L] bool. Returns local_sum * CP / N_global as a 0-d float32 tensor;
// its backward reuses the gradient the fused forward produced.
at::Tensor shifted_cp_loss(const at::Tensor& logits, const at::Tensor& labels,
                           const at::Tensor& valid, const MeshPtr& mesh,
                           const LossOptions& options = {});

// The same fused forward without autograd: the loss and d loss / d logits for a unit
// upstream gradient (scale it by the upstream). For autograd systems that register the
// backward themselves (the Python package); shifted_cp_loss already uses it.
struct LossWithGrad {
  at::Tensor loss;         // 0-d float32
  at::Tensor grad_logits;  // [B, L, V] float32
};
LossWithGrad shifted_cp_loss_with_grad(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& valid, const MeshPtr& mesh,
                                       const LossOptions& options = {});

// grad_logits *= upstream, in place: the backward of a wrapper around
// shifted_cp_loss_with_grad. No second [B, L, V] buffer; nothing at all when the upstream is
// exactly 1 (loss.backward()); a CUDA upstream is read on the device, never on the host.
// upstream: one element, on the CPU or grad_logits' device.
void scale_loss_gradient_(const at::Tensor& grad_logits, const at::Tensor& upstream);

// Whether a backward may hand its gradient on unscaled: a CPU upstream of exactly 1 (reading
// it costs no synchronisation; the kernels' rule, kernels/upstream_scale.hpp). For wrappers
// that scale the fused head's small gradients themselves (the Python package).
bool leaves_gradient_as_is(const at::Tensor& upstream);

// The in-place scaling above serves one backward: raises for a second one through a graph
// kept with retain_graph=True (`done`: a backward already ran for this forward).
void check_backward_once(bool done);

}  // namespace cpkit
