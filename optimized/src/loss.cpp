// shifted_cp_loss: targets with the boundary halo, a global target count, then one fused
// kernel that writes the per-row loss and the scaled gradient; backward reuses that gradient.
#include "cpkit/optimized/loss.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "host_cache_internal.hpp"
#include "kernels/upstream_scale.hpp"
#include "loss_kernel.hpp"
#include "loss_targets.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

void check_logits(const at::Tensor& logits) {
  detail::require_defined(logits, "logits");
  detail::require_dim(logits, 3, "logits");
  detail::require_contiguous(logits, "logits");
  if (logits.size(0) == 0 || logits.size(1) == 0)
    raise("logits", "empty batch: shape ", detail::shape_of(logits));
  if (logits.size(2) < 2) raise("logits", "vocabulary size must be >= 2, got ", logits.size(2));
}

detail::Targets prepare_targets(const at::Tensor& logits, const at::Tensor& labels,
                                const at::Tensor& valid, const MeshPtr& mesh,
                                const LossOptions& options) {
  check_logits(logits);
  detail::check_softcap(options.softcap);
  detail::Targets t = detail::prepare_targets(labels, valid, logits, "logits", logits.size(2),
                                              "logits", mesh, options.layout.get());
  // After the ranks' agreement, which compares dtypes: one rank's other dtype is then an
  // agreement error on every rank, not this rank's alone while its peers wait.
  detail::require_dtype(logits, at::kFloat, "logits");
  return t;
}

// The fused kernel: the scaled loss and its gradient for a unit upstream.
LossWithGrad fused_loss(const at::Tensor& logits, const detail::Targets& t, int64_t cp,
                        double softcap) {
  at::Tensor grad = detail::empty_reusable_like(logits);
  at::Tensor row_loss = at::empty({t.targets.numel()}, logits.options());
  at::Tensor scale = at::empty({1}, logits.options());
  detail::cross_entropy_rows(logits, t.targets, t.count, cp, softcap, grad, row_loss, scale);
  return {detail::scaled_loss(row_loss, scale), grad};
}

class ShiftedCrossEntropy : public torch::autograd::Function<ShiftedCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const at::Tensor& count, int64_t cp,
                            double softcap) {
    LossWithGrad out = fused_loss(logits, {targets, count}, cp, softcap);
    ctx->save_for_backward({out.grad_logits});
    return out.loss;
  }

  // The saved gradient is scaled in place and handed on (no second [T, V] buffer), so it
  // serves one backward: a second one through a retained graph raises instead of
  // silently scaling twice.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    check_backward_once(ctx->saved_data.count(kBackwardDone) > 0);
    ctx->saved_data[kBackwardDone] = true;
    at::Tensor grad = ctx->get_saved_variables()[0];
    scale_loss_gradient_(grad, grads[0]);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static constexpr const char* kBackwardDone = "backward_done";
};

}  // namespace

at::Tensor shifted_cp_loss(const at::Tensor& logits, const at::Tensor& labels,
                           const at::Tensor& valid, const MeshPtr& mesh,
                           const LossOptions& options) {
  const detail::Targets t = prepare_targets(logits, labels, valid, mesh, options);
  return ShiftedCrossEntropy::apply(logits, t.targets, t.count, int64_t{cp_size(mesh)},
                                    options.softcap);
}

LossWithGrad shifted_cp_loss_with_grad(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& valid, const MeshPtr& mesh,
                                       const LossOptions& options) {
  const detail::Targets t = prepare_targets(logits, labels, valid, mesh, options);
  const at::NoGradGuard no_grad;
  return fused_loss(logits.detach(), t, cp_size(mesh), options.softcap);
}

void scale_loss_gradient_(const at::Tensor& grad_logits, const at::Tensor& upstream) {
  detail::require_defined(grad_logits, "grad_logits");
  detail::require_dtype(grad_logits, at::kFloat, "grad_logits");
  detail::require_contiguous(grad_logits, "grad_logits");
  detail::require_defined(upstream, "upstream");
  if (upstream.numel() != 1)
    raise("upstream", "must have one element (the loss is a scalar), got shape ",
          detail::shape_of(upstream));
  if (upstream.is_cuda() && upstream.device() != grad_logits.device())
    raise("upstream", "is on ", upstream.device(), " but grad_logits is on ", grad_logits.device());
  detail::scale_by_upstream_in_place(grad_logits, upstream);
}

bool leaves_gradient_as_is(const at::Tensor& upstream) {
  return upstream.defined() && !upstream.is_cuda() && upstream.numel() == 1 &&
         kernels::leaves_gradient_as_is(upstream.item<float>());
}

void check_backward_once(bool done) {
  if (done)
    raise("shifted_cp_loss backward",
          "ran twice through one forward (retain_graph=True): the logits gradient was "
          "scaled in place by the first; call shifted_cp_loss again for a second backward");
}

}  // namespace cpkit
