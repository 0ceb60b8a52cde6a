// BSHD: validation, microbatches along the batch axis, and a rank's streams computed with
// device-agnostic ATen ops (CPU and CUDA tensors alike).
#include "cpkit/optimized/error.hpp"
#include "fault_injection.hpp"
#include "pad.hpp"
#include "sharder_internal.hpp"
#include "targets.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

void check_bshd(const CPBatch& batch, int num_chunks) {
  const auto B = batch.labels.size(0);
  if (batch.position_ids.defined()) {
    require_dtype(batch.position_ids, at::kLong, "position_ids");
    if (batch.position_ids.sizes() != batch.labels.sizes())
      raise("position_ids", "has shape ", shape_of(batch.position_ids), " but labels have ",
            shape_of(batch.labels));
  }
  if (batch.attention_mask.defined()) {
    if (batch.attention_mask.sizes() != batch.labels.sizes())
      raise("attention_mask", "has shape ", shape_of(batch.attention_mask), " but labels have ",
            shape_of(batch.labels));
    if (detail::check_values_of(batch.attention_mask)) {
      const at::Tensor mask = batch.attention_mask.to(at::kLong);
      const at::Tensor odd = (mask != 0) & (mask != 1);
      if (odd.any().item<bool>()) {
        const auto i = odd.flatten().nonzero()[0][0].item<int64_t>();
        raise("attention_mask", "value ", mask.flatten()[i].item<int64_t>(), " at [",
              i / mask.size(1), ", ", i % mask.size(1), "] is neither 0 nor 1");
      }
    }
  }
  if (B % num_chunks != 0)
    raise("num_chunks", "must divide the batch size B = ", B, ", got ", num_chunks);
}

}  // namespace

std::vector<Sharder::Microbatch> bshd_microbatches(const CPBatch& batch, int cp_size,
                                                   int num_chunks, const PadOptions& pad) {
  check_common(batch, cp_size, num_chunks, pad);
  check_bshd(batch, num_chunks);
  const auto rows = batch.labels.size(0) / num_chunks;
  const auto S = batch.labels.size(1);
  std::vector<Sharder::Microbatch> out;
  for (int m = 0; m < num_chunks; ++m) {
    Sharder::Microbatch mb;
    mb.first_row = m * rows;
    mb.rows = rows;
    mb.seq_len = S;
    out.push_back(mb);
  }
  return out;
}

void fill_bshd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                       LocalShard& shard) {
  const auto rows_of = [&](const at::Tensor& t) { return t.narrow(0, mb.first_row, mb.rows); };
  const auto S = l.seq_len;
  const at::Tensor t = at::arange(l.begin, l.end, batch.labels.options()).unsqueeze(0);
  const at::Tensor past_end = (t >= S).expand({mb.rows, l.local_len});
  at::Tensor padding = past_end.clone();
  if (batch.attention_mask.defined())
    padding |= cut_columns(rows_of(batch.attention_mask).to(at::kLong), l, 1) == 0;

  if (batch.position_ids.defined()) {
    const at::Tensor given = rows_of(batch.position_ids);
    const at::Tensor last = given.select(1, S - 1).unsqueeze(1);
    // Right padding continues the row's positions: last + 1, last + 2, ...
    shard.position_ids = at::where(past_end, last + (t - S + 1), cut_columns(given, l, 0));
  } else {
    shard.position_ids = t.expand({mb.rows, l.local_len}).contiguous();
  }
  if (detail::fault("positions_after_cut"))  // local 0..L-1 instead of the global positions
    shard.position_ids =
        at::arange(l.local_len, batch.labels.options()).expand({mb.rows, l.local_len}).contiguous();
  shard.document_ids = (~past_end).to(at::kLong);  // the row is one document
  shard.padding = padding;
  shard.labels = sharded_labels(padding, cut_columns(rows_of(batch.labels), l, kIgnoreLabel));
  shard.valid = valid_targets(padding, shard.labels, t);
}

}  // namespace cpkit::detail
