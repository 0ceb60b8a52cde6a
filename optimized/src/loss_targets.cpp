// Targets of the shifted loss: checks, the shift with the boundary halo, the global count.
#include "loss_targets.hpp"

#include <ATen/ATen.h>

#include "cpkit/optimized/constants.hpp"
#include "fault_injection.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

void check_targets_inputs(const at::Tensor& labels, const at::Tensor& valid,
                          const at::Tensor& source, const char* source_name, int64_t vocab) {
  require_defined(labels, "labels");
  require_defined(valid, "valid");
  require_dim(labels, 2, "labels");
  require_dtype(labels, at::kLong, "labels");
  require_dim(valid, 1, "valid");
  require_dtype(valid, at::kBool, "valid");
  const int64_t B = source.size(0), L = source.size(1);
  if (labels.size(0) != B || labels.size(1) != L)
    raise("labels", "has shape ", shape_of(labels), " but ", source_name, " need [", B, ", ", L,
          "]");
  if (valid.numel() != B * L) raise("valid", "has ", valid.numel(), " entries but B * L = ", B * L);
  if (labels.device() != source.device() || valid.device() != source.device())
    raise("labels", source_name, ", labels and valid must share a device, got ", source.device(),
          ", ", labels.device(), ", ", valid.device());
  if (!check_values_of(labels)) return;  // the kernels turn a stray label into NaN
  const at::Tensor outside = (labels != kIgnoreLabel) & ((labels < 0) | (labels >= vocab));
  if (outside.any().item<bool>()) {
    const auto at_index = outside.flatten().nonzero()[0][0].item<int64_t>();
    raise("labels", "value ", labels.flatten()[at_index].item<int64_t>(), " at [", at_index / L,
          ", ", at_index % L, "] is outside the vocabulary [0, ", vocab, ") and not ",
          kIgnoreLabel);
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
  at::Tensor targets = at::empty({B, L}, labels.options());
  targets.narrow(1, 0, L - 1).copy_(counted.narrow(1, 1, L - 1));
  at::Tensor halo = at::full({B}, kIgnoreLabel, labels.options());
  if (cp_size(mesh) > 1 && !fault("boundary_label_dropped")) {
    const at::Tensor first = counted.select(1, 0).contiguous();
    mesh->shift_from_next(first.data_ptr(), halo.data_ptr(), static_cast<std::size_t>(B),
                          ScalarKind::kInt64);
  }
  targets.select(1, L - 1).copy_(halo);
  return targets;
}

// N summed over the mesh, as a one-element int64 tensor on the targets' device (never read
// on the host: the kernel forms CP / N itself).
at::Tensor global_target_count(const at::Tensor& targets, const MeshPtr& mesh) {
  at::Tensor count = (targets != kIgnoreLabel).sum().to(at::kLong).reshape({1});
  if (cp_size(mesh) > 1 && !fault("count_local_only"))
    mesh->all_reduce_sum(count.data_ptr(), 1, ScalarKind::kInt64);
  if (fault("count_times_cp")) count *= cp_size(mesh);
  return count;
}

}  // namespace

Targets prepare_targets(const at::Tensor& labels, const at::Tensor& valid, const at::Tensor& source,
                        const char* source_name, int64_t vocab, const MeshPtr& mesh) {
  check_targets_inputs(labels, valid, source, source_name, vocab);
  at::Tensor targets = shifted_targets(labels, valid, mesh);
  return {targets, global_target_count(targets, mesh)};
}

}  // namespace cpkit::detail
