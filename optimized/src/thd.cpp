// THD: seq_lens parsing, one microbatch per packed row, and a rank's streams from the
// packed_token kernel body (shared with CUDA).
#include <ATen/Parallel.h>

#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"
#include "fault_injection.hpp"
#include "kernels/packed_layout.hpp"
#include "kernels/packed_layout_launch.hpp"
#include "kernels/targets.hpp"
#include "sharder_internal.hpp"
#include "targets.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

// One row of seq_lens / seq_lens_padded -> real lengths and slot lengths.
void parse_row(const int64_t* lens, const int64_t* slots, int64_t D, int64_t row, int64_t T,
               std::vector<int64_t>& real, std::vector<int64_t>& slot) {
  bool ended = false;
  int64_t total = 0;
  for (int64_t d = 0; d < D; ++d) {
    if ((lens[d] == kSeqLenSentinel) != (slots[d] == kSeqLenSentinel))
      raise("seq_lens_padded", "row ", row, " entry ", d, " is ", slots[d], " but seq_lens has ",
            lens[d], ": ", kSeqLenSentinel, " sentinels must stand at the same places in both");
    if (lens[d] == kSeqLenSentinel) {
      ended = true;
      continue;
    }
    if (ended)
      raise("seq_lens", "row ", row, " entry ", d, " = ", lens[d], " follows a ", kSeqLenSentinel,
            " sentinel; sentinels may only end the list");
    if (lens[d] < 0) raise("seq_lens", "row ", row, " entry ", d, " is negative: ", lens[d]);
    if (slots[d] < 0)
      raise("seq_lens_padded", "row ", row, " entry ", d, " is negative: ", slots[d]);
    if (lens[d] > slots[d])
      raise("seq_lens", "row ", row, " document ", d, " has length ", lens[d],
            " but its slot (seq_lens_padded) is only ", slots[d]);
    real.push_back(lens[d]);
    slot.push_back(slots[d]);
    total += slots[d];
  }
  if (real.empty())
    raise("seq_lens", "row ", row, " has no document, only ", kSeqLenSentinel, " sentinels");
  if (total > T)
    raise("seq_lens_padded", "row ", row, " slots sum to ", total, " but the row holds T = ", T,
          " tokens");
}

at::Tensor prefix_sums(const std::vector<int64_t>& v) {
  std::vector<int64_t> sums(v.size() + 1, 0);
  for (std::size_t i = 0; i < v.size(); ++i) sums[i + 1] = sums[i] + v[i];
  return at::tensor(sums, at::kLong);
}

}  // namespace

std::vector<Sharder::Microbatch> thd_microbatches(const CPBatch& batch, int cp_size, int num_chunks,
                                                  const PadOptions& pad) {
  check_common(batch, cp_size, num_chunks, pad);
  const auto rows = batch.labels.size(0), T = batch.labels.size(1);
  if (rows != num_chunks)
    raise("num_chunks", "a packed batch holds one row per microbatch, but labels has ", rows,
          " rows and num_chunks = ", num_chunks);
  require_defined(batch.seq_lens, "seq_lens");
  require_defined(batch.seq_lens_padded, "seq_lens_padded");
  require_dtype(batch.seq_lens, at::kLong, "seq_lens");
  require_dtype(batch.seq_lens_padded, at::kLong, "seq_lens_padded");
  if (batch.seq_lens.dim() != 2 || batch.seq_lens.size(0) != rows || batch.seq_lens.size(1) < 1)
    raise("seq_lens", "has shape ", shape_of(batch.seq_lens), " but [", rows,
          ", D >= 1] is required");
  if (batch.seq_lens_padded.sizes() != batch.seq_lens.sizes())
    raise("seq_lens_padded", "has shape ", shape_of(batch.seq_lens_padded), " but seq_lens has ",
          shape_of(batch.seq_lens));
  // Metadata is read on the host (it is small and usually arrives as CPU tensors).
  const at::Tensor lens = batch.seq_lens.cpu().contiguous();
  const at::Tensor slots = batch.seq_lens_padded.cpu().contiguous();
  const int64_t D = lens.size(1);
  std::vector<Sharder::Microbatch> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> real, slot;
    parse_row(lens.data_ptr<int64_t>() + r * D, slots.data_ptr<int64_t>() + r * D, D, r, T, real,
              slot);
    Sharder::Microbatch mb;
    mb.first_row = r;
    mb.rows = 1;
    mb.seq_len = T;
    mb.packed = true;
    mb.lens = at::tensor(real, at::kLong);
    mb.cu_lens = prefix_sums(real);
    mb.cu_padded = prefix_sums(slot);
    mb.plan = std::make_shared<const LayoutPlan>(
        pad.layout == LayoutKind::kBalanced
            ? plan_balanced(slot, T, cp_size, pad.pad_multiple, pad.balance_slack)
            : plan_layout(pad.layout, T, cp_size, pad.pad_multiple));
    out.push_back(mb);
  }
  return out;
}

namespace {

// All five streams of the shard's tokens (its fragments in order) on the host in one pass:
// document, position and padding from the slot walk, then labels (-100 on padding and past
// the row) and valid (a document's first token is predicted by nothing in that document).
void packed_streams_cpu(const at::Tensor& row_labels, const Sharder::Microbatch& mb,
                        const Layout& l, LocalShard& shard) {
  shard.document_ids = at::empty({1, l.local_len}, at::kLong);
  shard.position_ids = at::empty({1, l.local_len}, at::kLong);
  shard.padding = at::empty({1, l.local_len}, at::kBool);
  shard.labels = at::empty({1, l.local_len}, at::kLong);
  shard.valid = at::empty({l.local_len}, at::kBool);
  const at::Tensor labels_in = row_labels.contiguous();
  const int64_t* labels = labels_in.data_ptr<int64_t>();
  const int64_t* cu = mb.cu_padded.data_ptr<int64_t>();
  const int64_t* lens = mb.lens.data_ptr<int64_t>();
  const int64_t docs = mb.lens.numel(), T = l.seq_len;
  int64_t offset = 0;
  for (const Fragment& f : l.fragments) {
    int64_t* doc_out = shard.document_ids.data_ptr<int64_t>() + offset;
    int64_t* pos_out = shard.position_ids.data_ptr<int64_t>() + offset;
    bool* pad_out = shard.padding.data_ptr<bool>() + offset;
    int64_t* label_out = shard.labels.data_ptr<int64_t>() + offset;
    bool* valid_out = shard.valid.data_ptr<bool>() + offset;
    // Grain: tens of thousands of tokens are done before a second thread would wake.
    at::parallel_for(0, f.size(), 65536, [&](int64_t begin, int64_t end) {
      kernels::PackedWalk walk(f.begin + begin, cu, lens, docs);
      for (int64_t j = begin; j < end; ++j) {
        const int64_t t = f.begin + j;
        const kernels::PackedToken tok = walk.at(t);
        const int64_t label = kernels::sharded_label(tok.padding || t >= T, t < T ? labels[t] : 0);
        doc_out[j] = tok.document;
        pos_out[j] = tok.position;
        pad_out[j] = tok.padding;
        label_out[j] = label;
        valid_out[j] = kernels::is_valid_target(tok.padding, label, tok.position);
      }
    });
    offset += f.size();
  }
}

// The same on the GPU: only the document offsets travel to the device, in one copy that
// does not block the host (cuda_glue.hpp's upload; not inside CUDA-graph capture).
void packed_layout_device(const Sharder::Microbatch& mb, const Layout& l, at::Device device,
                          LocalShard& shard) {
  const auto on_device = at::TensorOptions().device(device);
  const int64_t docs = mb.lens.numel();
  const at::Tensor offsets =
      upload(at::cat({mb.cu_padded, mb.lens}), device, "packed (THD) document offsets");
  const at::Tensor cu = offsets.narrow(0, 0, mb.cu_padded.numel());
  const at::Tensor lens = offsets.narrow(0, mb.cu_padded.numel(), docs);
  shard.document_ids = at::empty({1, l.local_len}, on_device.dtype(at::kLong));
  shard.position_ids = at::empty({1, l.local_len}, on_device.dtype(at::kLong));
  shard.padding = at::empty({1, l.local_len}, on_device.dtype(at::kBool));
  int64_t offset = 0;
  for (const Fragment& f : l.fragments) {  // one launch per fragment
    kernels::PackedLayoutArgs args{cu.data_ptr<int64_t>(),
                                   lens.data_ptr<int64_t>(),
                                   docs,
                                   f.begin,
                                   f.size(),
                                   shard.document_ids.data_ptr<int64_t>() + offset,
                                   shard.position_ids.data_ptr<int64_t>() + offset,
                                   shard.padding.data_ptr<bool>() + offset};
    launch_on(shard.document_ids, [&](void* stream) { kernels::packed_layout_cuda(args, stream); });
    offset += f.size();
  }
}

}  // namespace

namespace {

// Labels and valid derived from the layout streams with ATen ops (any device).
void labels_and_valid_from_layout(const at::Tensor& row_labels, const Layout& l,
                                  LocalShard& shard) {
  shard.labels = sharded_labels(shard.padding, cut_columns(row_labels, l, kIgnoreLabel));
  shard.valid = valid_targets(shard.padding, shard.labels, shard.position_ids);
}

}  // namespace

void fill_thd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                      LocalShard& shard) {
  const auto device = batch.labels.device();
  const at::Tensor row_labels = batch.labels.narrow(0, mb.first_row, 1);
  if (device.is_cuda() && cuda_kernels_built()) {
    packed_layout_device(mb, l, device, shard);
    return labels_and_valid_from_layout(row_labels, l, shard);
  }
  // Host pass (without CUDA kernels, CUDA tensors are computed here, then moved).
  packed_streams_cpu(row_labels.squeeze(0).cpu(), mb, l, shard);
  move_streams(shard, device);
  // Planted bugs (test-only twin): corrupt the layout, then derive labels and valid from it.
  const bool positions_global = detail::fault("packed_positions_global");
  const bool padding_tail_only = detail::fault("padding_row_tail_only");
  if (!positions_global && !padding_tail_only) return;
  if (positions_global)  // never restarting per document
    shard.position_ids = at::where(
        shard.document_ids > 0,
        at::tensor(layout_positions(*l.plan, l.rank), shard.position_ids.options()).unsqueeze(0),
        shard.position_ids);
  if (padding_tail_only)  // slot padding taken for real tokens
    shard.padding = shard.document_ids == 0;
  labels_and_valid_from_layout(row_labels, l, shard);
}

}  // namespace cpkit::detail
