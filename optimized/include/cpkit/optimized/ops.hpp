// The CP operations on LibTorch tensors (docs/spec.md sections 4 and 5).
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// [N, ...] on every rank -> [CP * N, ...] in rank order. Differentiable: backward is one
// reduce-scatter SUM onto the owning rank. Counts or trailing shapes that differ across
// ranks raise cpkit::Error on every rank.
at::Tensor gather_tokens(const at::Tensor& value, const MeshPtr& mesh, bool differentiable);

struct LossOptions {
  double softcap = 0.0;  // > 0: apply c * tanh(z / c) (and its chain rule) inside the kernel
};

// HF shifted CE across shard boundaries. logits [B, L, V] float32, labels [B, L] int64
// unshifted, valid [B * L] bool. Returns local_sum * CP / N_global as a 0-d float32 tensor;
// its backward reuses the gradient the fused forward produced.
at::Tensor shifted_cp_loss(const at::Tensor& logits, const at::Tensor& labels,
                           const at::Tensor& valid, const MeshPtr& mesh,
                           const LossOptions& options = {});

}  // namespace cpkit
