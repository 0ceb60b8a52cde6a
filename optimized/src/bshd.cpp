// BSHD: validation, microbatches along the batch axis, and a rank's token streams in one
// pass (kernels/bshd_layout.hpp: a CPU loop, or one CUDA kernel for CUDA tensors).

#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"
#include "fault_injection.hpp"
#include "kernels/bshd_layout.hpp"
#include "sharder_internal.hpp"
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
  if (pad.layout == LayoutKind::kBalanced)
    raise("layout",
          "\"balanced\" plans packed (THD) documents; BSHD rows take \"contiguous\" "
          "or \"head_tail\"");
  // Every microbatch has the same columns, so the same plan.
  const auto plan =
      std::make_shared<const LayoutPlan>(plan_layout(pad.layout, S, cp_size, pad.pad_multiple));
  std::vector<Sharder::Microbatch> out;
  for (int m = 0; m < num_chunks; ++m) {
    Sharder::Microbatch mb;
    mb.first_row = m * rows;
    mb.rows = rows;
    mb.seq_len = S;
    mb.plan = plan;
    out.push_back(mb);
  }
  return out;
}

namespace {

// Rows [first_row, first_row + rows) of an int64 [B, S] input whose columns are adjacent
// (a view in the usual case), as int64, on `device`.
at::Tensor int64_rows(const at::Tensor& t, const Sharder::Microbatch& mb,
                      const at::Device& device) {
  at::Tensor rows = t.narrow(0, mb.first_row, mb.rows).to(device, at::kLong);
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

}  // namespace

void fill_bshd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                       LocalShard& shard) {
  const at::Device device = batch.labels.device();
  // Without the CUDA kernels, CUDA tensors take the host pass, then move (as THD's do).
  const bool on_gpu = device.is_cuda() && cuda_kernels_built();
  const at::Device where = on_gpu ? device : at::Device(at::kCPU);
  const auto out = at::TensorOptions().device(where);
  const at::Tensor labels = int64_rows(batch.labels, mb, where);
  const at::Tensor mask =
      batch.attention_mask.defined() ? int64_rows(batch.attention_mask, mb, where) : at::Tensor();
  const at::Tensor positions =
      batch.position_ids.defined() ? int64_rows(batch.position_ids, mb, where) : at::Tensor();
  shard.position_ids = at::empty({mb.rows, l.local_len}, out.dtype(at::kLong));
  shard.document_ids = at::empty({mb.rows, l.local_len}, out.dtype(at::kLong));
  shard.padding = at::empty({mb.rows, l.local_len}, out.dtype(at::kBool));
  shard.labels = at::empty({mb.rows, l.local_len}, out.dtype(at::kLong));
  shard.valid = at::empty({mb.rows * l.local_len}, out.dtype(at::kBool));
  // One pass per fragment, each writing its columns of the [rows, L] outputs.
  kernels::BshdLayoutArgs args{};
  args.labels = labels.data_ptr<int64_t>();
  args.labels_pitch = labels.stride(0);
  if (mask.defined()) {
    args.mask = mask.data_ptr<int64_t>();
    args.mask_pitch = mask.stride(0);
  }
  if (positions.defined()) {
    args.positions = positions.data_ptr<int64_t>();
    args.positions_pitch = positions.stride(0);
  }
  args.rows = mb.rows;
  args.seq_len = l.seq_len;
  args.out_pitch = l.local_len;
  int64_t offset = 0;
  for (const Fragment& f : l.fragments) {
    args.begin = f.begin;
    args.count = f.size();
    args.position = shard.position_ids.data_ptr<int64_t>() + offset;
    args.document = shard.document_ids.data_ptr<int64_t>() + offset;
    args.padding = shard.padding.data_ptr<bool>() + offset;
    args.label = shard.labels.data_ptr<int64_t>() + offset;
    args.valid = shard.valid.data_ptr<bool>() + offset;
    if (on_gpu)
      launch_on(labels, [&](void* stream) { kernels::bshd_layout_cuda(args, stream); });
    else
      kernels::bshd_layout_cpu(args);
    offset += f.size();
  }
  if (!on_gpu) move_streams(shard, device);
  if (detail::fault("positions_after_cut"))  // local 0..L-1 instead of the global positions
    shard.position_ids = at::arange(l.local_len, batch.labels.options().dtype(at::kLong))
                             .expand({mb.rows, l.local_len})
                             .contiguous();
}

}  // namespace cpkit::detail
