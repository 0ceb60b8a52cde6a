// The LM head's three GEMMs over chunks of token rows, in the precision asked for (internal
// header): what shifted_cp_linear_loss and token_logprobs share around their kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cpkit/optimized/logits_precision.hpp"

namespace cpkit::detail {

// The checks both fused-head ops make: hidden [B, L, H] and weight [V, H] of one dtype
// (float32 or bfloat16) and device, V >= 2; chunk_rows >= 0; softcap as section 5.
void check_head_inputs(const at::Tensor& hidden, const at::Tensor& weight, double softcap,
                       int64_t chunk_rows);

// Rows per chunk: the option when set (at most `rows`), else the default rule.
int64_t head_chunk_rows(int64_t chunk_rows, int64_t vocab, int64_t rows, bool cuda);

class HeadGemms {
 public:
  // hidden [rows, H] and weight [V, H], checked. A bf16 head under LogitsPrecision::kFp32 is
  // upcast once per call (exact: every bf16 value is an fp32 value), so its products and sums
  // are fp32 GEMMs: V * H * 4 bytes more than the bf16 head.
  HeadGemms(const at::Tensor& hidden, const at::Tensor& weight, LogitsPrecision precision);

  // The fp32 logits of rows [begin, begin + z.size(0)) into z [n, V].
  void logits(int64_t begin, const at::Tensor& z) const;
  // The logit gradient g (fp32 [n, V]) as both gradient GEMMs take it: g itself, or rounded
  // to bf16 (kInput: what autograd of HF's logits.float() hands the head's matmul).
  at::Tensor gradient_operand(const at::Tensor& g) const;
  // out (hidden's dtype, [n, H]) = g @ weight.
  void grad_hidden(const at::Tensor& g, const at::Tensor& out) const;
  // fp32 acc [V, H] = (first) or += g^T @ rows [begin, begin + n) of hidden.
  void accumulate_grad_weight(const at::Tensor& acc, const at::Tensor& g, int64_t begin,
                              bool first) const;

 private:
  at::Tensor hidden_;  // [rows, H] as the GEMMs read it (fp32 when round_ is false)
  at::Tensor weight_;  // [V, H] likewise
  bool round_;         // a bf16 head under kInput: bf16 GEMMs, logits rounded to bf16
};

}  // namespace cpkit::detail
