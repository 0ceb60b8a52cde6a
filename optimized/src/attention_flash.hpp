// cp_attention's stages through torch's varlen flash kernels (CUDA, bf16 or fp16, no soft cap or
// sinks, D a multiple of 8 up to 256): a stage's varlen sequences (attention_runs.hpp) with
// their queries and key slots gathered, the results scattered back to query rows and key
// slots. Internal header.
#pragma once

#include <ATen/core/Tensor.h>

#include "attention_runs.hpp"
#include "cpkit/optimized/cp_attention.hpp"

namespace cpkit::detail {

// Whether the flash kernels take q ([rows, L, Hq, D]) under `options`.
bool flash_takes(const at::Tensor& q, const CpAttentionOptions& options);

// One stage's tensors: q [queries, Hq, D] and the key slots [slots, Hkv, D] (q's dtype; slot
// s is row s - first_slot); `scale` > 0.
struct FlashStage {
  at::Tensor q, keys, values;
  std::int64_t first_slot;
  double scale;
};

// Writes the runs' queries' rows of out [queries, Hq, D] and lse [queries, Hq] (float32);
// other rows are left as they are.
void flash_forward(const FlashStage& stage, const VarlenRuns& runs, at::Tensor& out,
                   at::Tensor& lse);

// Adds the runs' gradients to dq [queries, Hq, D], dk and dv [slots, Hkv, D] (float32), from
// the final out (q's dtype) and lse [queries, Hq] of every stage together: each probability
// is then exact whatever keys the other stages held.
void flash_backward(const FlashStage& stage, const VarlenRuns& runs, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& grad_out, at::Tensor& dq,
                    at::Tensor& dk, at::Tensor& dv);

}  // namespace cpkit::detail
