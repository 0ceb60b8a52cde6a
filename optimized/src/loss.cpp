// shifted_cp_loss: targets with the boundary halo, a global target count, then one fused
// kernel that writes the per-row loss and the scaled gradient; backward reuses that gradient.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cpkit/optimized/loss.hpp"
#include "cuda_glue.hpp"
#include "fault_injection.hpp"
#include "host_cache_internal.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

void check_loss_inputs(const at::Tensor& logits, const at::Tensor& labels,
                       const at::Tensor& valid) {
  detail::require_defined(logits, "logits");
  detail::require_defined(labels, "labels");
  detail::require_defined(valid, "valid");
  detail::require_dim(logits, 3, "logits");
  detail::require_dtype(logits, at::kFloat, "logits");
  if (!logits.is_contiguous())
    raise("logits", "must be contiguous (shape ", detail::shape_of(logits), ", strides ",
          logits.strides(), "); a silent copy of the logits is never made");
  detail::require_dim(labels, 2, "labels");
  detail::require_dtype(labels, at::kLong, "labels");
  detail::require_dim(valid, 1, "valid");
  detail::require_dtype(valid, at::kBool, "valid");
  const int64_t B = logits.size(0), L = logits.size(1), V = logits.size(2);
  if (B == 0 || L == 0) raise("logits", "empty batch: shape ", detail::shape_of(logits));
  if (V < 2) raise("logits", "vocabulary size must be >= 2, got ", V);
  if (labels.size(0) != B || labels.size(1) != L)
    raise("labels", "has shape ", detail::shape_of(labels), " but logits need [", B, ", ", L, "]");
  if (valid.numel() != B * L) raise("valid", "has ", valid.numel(), " entries but B * L = ", B * L);
  if (labels.device() != logits.device() || valid.device() != logits.device())
    raise("labels", "logits, labels and valid must share a device, got ", logits.device(), ", ",
          labels.device(), ", ", valid.device());
  const at::Tensor outside = (labels != kIgnoreLabel) & ((labels < 0) | (labels >= V));
  if (outside.any().item<bool>()) {
    const auto at_index = outside.flatten().nonzero()[0][0].item<int64_t>();
    raise("labels", "value ", labels.flatten()[at_index].item<int64_t>(), " at [", at_index / L,
          ", ", at_index % L, "] is outside the vocabulary [0, ", V, ") and not ", kIgnoreLabel);
  }
  const at::Tensor bad_valid = valid & (labels.flatten() == kIgnoreLabel);
  if (bad_valid.any().item<bool>())
    raise("valid", "marks token ", bad_valid.nonzero()[0][0].item<int64_t>(),
          " valid but its label is ", kIgnoreLabel);
}

// targets[b, j]: the label position j predicts, -100 when it counts nothing. The last column
// comes from the next rank's first column.
at::Tensor shifted_targets(const at::Tensor& labels, const at::Tensor& valid, const MeshPtr& mesh) {
  const int64_t B = labels.size(0), L = labels.size(1);
  const at::Tensor counted =
      at::where(valid.reshape({B, L}), labels, at::full_like(labels, kIgnoreLabel));
  at::Tensor targets = at::empty_like(labels);
  targets.narrow(1, 0, L - 1).copy_(counted.narrow(1, 1, L - 1));
  at::Tensor halo = at::full({B}, kIgnoreLabel, labels.options());
  if (cp_size(mesh) > 1 && !detail::fault("boundary_label_dropped")) {
    const at::Tensor first = counted.select(1, 0).contiguous();
    mesh->shift_from_next(first.data_ptr(), halo.data_ptr(), static_cast<std::size_t>(B),
                          ScalarKind::kInt64);
  }
  targets.select(1, L - 1).copy_(halo);
  return targets;
}

// N summed over the mesh, as a one-element int64 tensor on the logits' device (never read
// on the host: the kernel forms CP / N itself).
at::Tensor global_target_count(const at::Tensor& targets, const MeshPtr& mesh) {
  at::Tensor count = (targets != kIgnoreLabel).sum().to(at::kLong).reshape({1});
  if (cp_size(mesh) > 1 && !detail::fault("count_local_only"))
    mesh->all_reduce_sum(count.data_ptr(), 1, ScalarKind::kInt64);
  if (detail::fault("count_times_cp")) count *= cp_size(mesh);
  return count;
}

// The fused kernel: the scaled loss and its gradient for a unit upstream.
LossWithGrad fused_loss(const at::Tensor& logits, const at::Tensor& targets,
                        const at::Tensor& count, int64_t cp, double softcap) {
  at::Tensor grad = detail::empty_reusable_like(logits);
  at::Tensor row_loss = at::empty({targets.numel()}, logits.options());
  at::Tensor scale = at::empty({1}, logits.options());
  const at::Tensor flat_targets = targets.contiguous();
  kernels::CrossEntropyArgs args{};
  args.logits = logits.data_ptr<float>();
  args.targets = flat_targets.data_ptr<int64_t>();
  args.rows = targets.numel();
  args.vocab = logits.size(2);
  args.softcap = static_cast<float>(softcap);
  args.cp = static_cast<int>(cp);
  args.count = count.data_ptr<int64_t>();
  args.grad = grad.data_ptr<float>();
  args.row_loss = row_loss.data_ptr<float>();
  args.scale = scale.data_ptr<float>();
  if (logits.is_cuda()) {
#if CPKIT_WITH_CUDA
    kernels::cross_entropy_cuda(args, detail::current_stream(logits));
#else
    detail::current_stream(logits);  // raises: built without the CUDA kernels
#endif
  } else {
    kernels::cross_entropy_cpu(args);
  }
  if (detail::fault("nan_without_targets"))  // CP / N without the N == 0 rule
    scale = static_cast<double>(cp) / count.to(at::kDouble);
  // A fixed-order double sum (the same bits for any thread count), times the kernel's CP / N.
  return {(row_loss.to(at::kDouble).sum() * scale.to(at::kDouble).squeeze(0)).to(at::kFloat), grad};
}

class ShiftedCrossEntropy : public torch::autograd::Function<ShiftedCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const at::Tensor& count, int64_t cp,
                            double softcap) {
    LossWithGrad out = fused_loss(logits, targets, count, cp, softcap);
    ctx->save_for_backward({out.grad_logits});
    return out.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor grad = ctx->get_saved_variables()[0];
    // The usual upstream is exactly 1 (loss.backward()): hand back the kernel's gradient
    // without another pass over [B, L, V]. Reading a CPU scalar costs no synchronisation.
    const at::Tensor& upstream = grads[0];
    const bool unit =
        !upstream.is_cuda() && upstream.numel() == 1 && upstream.item<float>() == 1.0f;
    return {unit ? grad : grad * upstream, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace {

// What both entry points do before the kernel: check, shift with the halo, count over the mesh.
struct Targets {
  at::Tensor targets, count;
};

Targets prepare_targets(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& valid,
                        const MeshPtr& mesh) {
  check_loss_inputs(logits, labels, valid);
  at::Tensor targets = shifted_targets(labels, valid, mesh);
  at::Tensor count = global_target_count(targets, mesh);
  return {targets, count};
}

}  // namespace

at::Tensor shifted_cp_loss(const at::Tensor& logits, const at::Tensor& labels,
                           const at::Tensor& valid, const MeshPtr& mesh,
                           const LossOptions& options) {
  const Targets t = prepare_targets(logits, labels, valid, mesh);
  return ShiftedCrossEntropy::apply(logits, t.targets, t.count, int64_t{cp_size(mesh)},
                                    options.softcap);
}

LossWithGrad shifted_cp_loss_with_grad(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& valid, const MeshPtr& mesh,
                                       const LossOptions& options) {
  const Targets t = prepare_targets(logits, labels, valid, mesh);
  const at::NoGradGuard no_grad;
  return fused_loss(logits.detach(), t.targets, t.count, cp_size(mesh), options.softcap);
}

}  // namespace cpkit
