// shifted_cp_linear_loss: the LM head fused into the shifted CP loss (docs/spec.md section
// 5a). The [B, L, V] logits are never materialised: rows of hidden states go through the head
// a chunk at a time, and each chunk's logits become its gradient in place.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/logits_precision.hpp"

namespace cpkit {

struct LinearLossOptions {
  double softcap = 0.0;    // > 0: the loss sees c * tanh(z / c), as in LossOptions
  int64_t chunk_rows = 0;  // token rows per chunk; 0: default_linear_loss_chunk_rows
  // A bf16 head's logits: rounded to bf16 (HF's eager numerics, the default) or kept fp32.
  LogitsPrecision logits_precision = LogitsPrecision::kInput;
  std::shared_ptr<const LayoutPlan> layout = nullptr;  // as in LossOptions; none: contiguous
};

// The default chunk: as many rows as fit a budget of fp32 logits (128 MiB and at most 512 rows
// for CPU tensors, 1 GiB for CUDA tensors), rounded down to a multiple of 64 rows when that is
// at least 64, never more than `rows`. The extra memory of a call is about one chunk of
// logits; each chunk also reads and writes d weight [V, H] once, so fewer rows cost time.
// token_logprobs and policy_loss have their own (default_logprob_chunk_rows).
int64_t default_linear_loss_chunk_rows(int64_t vocab, int64_t rows, bool cuda);

// Returns what shifted_cp_loss(logits, labels, valid, mesh, {softcap}) returns for logits =
// hidden @ weight^T (computed in hidden's dtype, then fp32; under LogitsPrecision::kFp32 in
// fp32 throughout), with gradients for hidden and weight. hidden [B, L, H] and weight [V, H]:
// float32 or bfloat16, the same dtype and device; labels [B, L] int64 unshifted; valid [B * L]
// bool. The boundary target and the global count are exchanged once per call. Statistics, the loss
// and the weight gradient's accumulator are fp32; bf16 gradients are rounded once at the end
// (weight) or per chunk (hidden, a bf16 matmul of the fp32 logit gradient rounded to bf16).
at::Tensor shifted_cp_linear_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                  const at::Tensor& labels, const at::Tensor& valid,
                                  const MeshPtr& mesh, const LinearLossOptions& options = {});

// The same without autograd: the loss and the gradients for a unit upstream (scale them by
// the upstream). A gradient not asked for is not computed (an undefined tensor).
struct LinearLossWithGrad {
  at::Tensor loss;         // 0-d float32
  at::Tensor grad_hidden;  // [B, L, H], hidden's dtype
  at::Tensor grad_weight;  // [V, H], weight's dtype
};
struct LinearLossGrads {
  bool hidden = true;
  bool weight = true;
};
LinearLossWithGrad shifted_cp_linear_loss_with_grad(const at::Tensor& hidden,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& labels,
                                                    const at::Tensor& valid, const MeshPtr& mesh,
                                                    const LinearLossOptions& options = {},
                                                    LinearLossGrads grads = {});

}  // namespace cpkit
