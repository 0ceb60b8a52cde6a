// Each varlen batch is one call: causal sequences with the plan's left window (bottom-right
// aligned, as flash aligns them), full ones without a mask. Offsets are uploaded per call
// like the kernels' key indexes.
#include "attention_flash.hpp"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "cuda_glue.hpp"

namespace cpkit::detail {

namespace {

struct Uploaded {
  at::Tensor queries, slots, cu_q, cu_k;
};

Uploaded upload_batch(const VarlenBatch& batch, std::int64_t first_slot, const at::Device& device) {
  std::vector<std::int64_t> rows(batch.key_slots);
  for (std::int64_t& slot : rows) slot -= first_slot;
  return {upload(at::tensor(batch.queries, at::kLong), device, "cp_attention's varlen queries"),
          upload(at::tensor(rows, at::kLong), device, "cp_attention's varlen keys"),
          upload(at::tensor(batch.cu_q, at::kInt), device, "cp_attention's cu_seqlens_q"),
          upload(at::tensor(batch.cu_k, at::kInt), device, "cp_attention's cu_seqlens_k")};
}

// Flash's (left, right) window: causal with the runs' left window, or no mask at all.
std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>> window_of(
    const VarlenRuns& runs, bool causal) {
  if (causal) return {runs.left, 0};
  return {std::nullopt, std::nullopt};
}

}  // namespace

bool flash_takes(const at::Tensor& q, const CpAttentionOptions& options) {
  const std::int64_t d = q.size(-1);
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  return q.is_cuda() && half && options.softcap == 0 && !options.sinks.defined() && d % 8 == 0 &&
         d <= 256;
}

void flash_forward(const FlashStage& stage, const VarlenRuns& runs, at::Tensor& out,
                   at::Tensor& lse) {
  for (const bool causal : {true, false}) {
    const VarlenBatch& batch = causal ? runs.causal : runs.full;
    if (batch.empty()) continue;
    const Uploaded u = upload_batch(batch, stage.first_slot, stage.q.device());
    const auto [left, right] = window_of(runs, causal);
    const auto result = at::_flash_attention_forward(
        stage.q.index_select(0, u.queries), stage.keys.index_select(0, u.slots),
        stage.values.index_select(0, u.slots), u.cu_q, u.cu_k, batch.max_q, batch.max_k, 0.0,
        causal, false, stage.scale, left, right);
    out.index_copy_(0, u.queries, std::get<0>(result).to(at::kFloat));
    lse.index_copy_(0, u.queries, std::get<1>(result).t());  // flash's lse is [Hq, queries]
  }
}

void flash_backward(const FlashStage& stage, const VarlenRuns& runs, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& grad_out, at::Tensor& dq,
                    at::Tensor& dk, at::Tensor& dv) {
  for (const bool causal : {true, false}) {
    const VarlenBatch& batch = causal ? runs.causal : runs.full;
    if (batch.empty()) continue;
    const Uploaded u = upload_batch(batch, stage.first_slot, stage.q.device());
    const auto [left, right] = window_of(runs, causal);
    // No dropout: flash reads no random state.
    const at::Tensor rng = at::zeros({2}, stage.q.options().dtype(at::kUInt64));
    const at::Tensor unused = at::empty({0}, stage.q.options());
    const auto [dq_b, dk_b, dv_b] = at::_flash_attention_backward(
        grad_out.index_select(0, u.queries), stage.q.index_select(0, u.queries),
        stage.keys.index_select(0, u.slots), stage.values.index_select(0, u.slots),
        out.index_select(0, u.queries), lse.index_select(0, u.queries).t().contiguous(), u.cu_q,
        u.cu_k, batch.max_q, batch.max_k, 0.0, causal, rng, unused, stage.scale, left, right);
    dq.index_add_(0, u.queries, dq_b.to(at::kFloat));
    dk.index_add_(0, u.slots, dk_b.to(at::kFloat));
    dv.index_add_(0, u.slots, dv_b.to(at::kFloat));
  }
}

}  // namespace cpkit::detail
