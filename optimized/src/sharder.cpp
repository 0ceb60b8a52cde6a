// The Sharder: layouts, local shards and the differentiable in-forward cut.
#include <torch/csrc/autograd/custom_function.h>

#include "cpkit/optimized/error.hpp"
#include "fault_injection.hpp"
#include "plan_ties.hpp"
#include "sharder_internal.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

// Pads and cuts one microbatch's spliced primary stream; backward scatters the local
// gradient back onto this rank's columns of a zero gradient shaped like the input.
class CutSpliced : public torch::autograd::Function<CutSpliced> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& spliced,
                            const Layout& layout, double fill) {
    // What the backward needs: [seq_len, local_len, begin0, end0, begin1, end1, ...].
    std::vector<int64_t> saved{layout.seq_len, layout.local_len};
    for (const Fragment& f : layout.fragments) saved.insert(saved.end(), {f.begin, f.end});
    ctx->saved_data["layout"] = saved;
    return cut_columns(spliced, layout, fill);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> saved = ctx->saved_data["layout"].toIntVector();
    Layout l;
    l.seq_len = saved[0];
    l.local_len = saved[1];
    for (std::size_t i = 2; i + 1 < saved.size(); i += 2)
      l.fragments.push_back({saved[i], saved[i + 1]});
    return {cut_columns_backward(grads[0], l), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Sharder::Sharder(CPBatch batch, MeshPtr mesh, int cp_size, bool shard_primary, PadOptions pad,
                 std::vector<Microbatch> microbatches)
    : batch_(std::move(batch)),
      mesh_(std::move(mesh)),
      cp_size_(cp_size),
      shard_primary_(shard_primary),
      pad_(pad),
      microbatches_(std::move(microbatches)) {}
Sharder::~Sharder() = default;
Sharder::Sharder(Sharder&&) noexcept = default;
Sharder& Sharder::operator=(Sharder&&) noexcept = default;

int Sharder::num_microbatches() const { return static_cast<int>(microbatches_.size()); }

const Sharder::Microbatch& Sharder::microbatch(int index) const {
  if (index < 0 || index >= num_microbatches())
    raise("microbatch", "must be in [0, ", num_microbatches(), "), got ", index);
  return microbatches_[static_cast<std::size_t>(index)];
}

void Sharder::check_rank(int rank) const {
  if (rank < 0 || rank >= cp_size_) raise("rank", "must be in [0, ", cp_size_, "), got ", rank);
}

Layout Sharder::layout(int index, int rank) const {
  check_rank(rank);
  return layout_of(microbatch(index).plan, rank);
}

LocalShard Sharder::local(int index, int rank) const {
  const Layout l = layout(index, rank);
  const Microbatch& mb = microbatch(index);
  LocalShard shard;
  shard.layout = l;
  // The primary stream first: on a GPU its copy (the bulk of the bytes) is queued before the
  // small token-stream launches, which the host then dispatches while it runs.
  if (shard_primary_) {
    if (batch_.input_ids.defined())
      shard.input_ids = cut_columns(batch_.input_ids.narrow(0, mb.first_row, mb.rows), l,
                                    static_cast<double>(pad_.pad_token_id));
    else
      shard.inputs_embeds =
          cut_columns(batch_.inputs_embeds.narrow(0, mb.first_row, mb.rows), l, 0.0);
  }
  if (mb.packed)
    detail::fill_thd_streams(batch_, mb, l, shard);
  else
    detail::fill_bshd_streams(batch_, mb, l, shard);
  detail::tie_to_plan(shard.labels, l.plan);  // a loss given no plan or another one can tell
  detail::tie_to_plan(shard.valid, l.plan);
  return shard;
}

at::Tensor Sharder::global_primary(int index) const {
  const Microbatch& mb = microbatch(index);
  const at::Tensor& primary = batch_.input_ids.defined() ? batch_.input_ids : batch_.inputs_embeds;
  return primary.narrow(0, mb.first_row, mb.rows);
}

void check_spliced(const at::Tensor& spliced, int64_t rows, const Layout& layout) {
  detail::require_defined(spliced, "spliced");
  if (spliced.dim() < 2 || spliced.size(0) != rows || spliced.size(1) != layout.seq_len)
    raise("spliced", "has shape ", detail::shape_of(spliced), " but [", rows, ", ", layout.seq_len,
          ", ...] is required");
}

at::Tensor Sharder::cut_spliced(int index, int rank, const at::Tensor& spliced) const {
  Layout l = layout(index, rank);
  const Microbatch& mb = microbatch(index);
  if (detail::fault("spliced_cut_shifted") && l.fragments.front().begin > 0) {
    l.fragments.front().begin -= 1;  // off by one
    l.fragments.front().end -= 1;
  }
  check_spliced(spliced, mb.rows, l);
  const double fill = spliced.is_floating_point() ? 0.0 : static_cast<double>(pad_.pad_token_id);
  if (!spliced.is_floating_point()) return cut_columns(spliced, l, fill);  // ids
  return CutSpliced::apply(spliced, l, fill);
}

at::Tensor Sharder::cu_seqlens(int index) const {
  const Microbatch& mb = microbatch(index);
  if (!mb.packed) raise("microbatch", "cu_seqlens exists for packed (THD) batches only");
  return mb.cu_lens;
}

at::Tensor Sharder::cu_seqlens_padded(int index) const {
  const Microbatch& mb = microbatch(index);
  if (!mb.packed) raise("microbatch", "cu_seqlens_padded exists for packed (THD) batches only");
  return mb.cu_padded;
}

namespace {

void check_format(const CPBatch& batch, const char* expected, const char* call, const char* other) {
  if (batch.qkv_format != expected)
    raise("qkv_format", call, " takes \"", expected, "\" batches, got \"", batch.qkv_format,
          "\" (use ", other, ")");
}

}  // namespace

Sharder prepare_cp_inputs_for(const CPBatch& batch, int cp_size, int num_chunks, bool shard_primary,
                              const PadOptions& pad) {
  check_format(batch, "bshd", "prepare_cp_inputs_for", "prepare_packed_cp_inputs_for");
  auto microbatches = detail::bshd_microbatches(batch, cp_size, num_chunks, pad);
  return Sharder(batch, nullptr, cp_size, shard_primary, pad, std::move(microbatches));
}

Sharder prepare_packed_cp_inputs_for(const CPBatch& batch, int cp_size, int num_chunks,
                                     bool shard_primary, const PadOptions& pad) {
  check_format(batch, "thd", "prepare_packed_cp_inputs_for", "prepare_cp_inputs_for");
  auto microbatches = detail::thd_microbatches(batch, cp_size, num_chunks, pad);
  return Sharder(batch, nullptr, cp_size, shard_primary, pad, std::move(microbatches));
}

Sharder prepare_cp_inputs(const CPBatch& batch, const MeshPtr& mesh, int num_chunks,
                          bool shard_primary, const PadOptions& pad) {
  check_format(batch, "bshd", "prepare_cp_inputs", "prepare_packed_cp_inputs");
  auto microbatches = detail::bshd_microbatches(batch, cp_size(mesh), num_chunks, pad);
  detail::check_batch_agrees(batch, mesh, num_chunks, pad);
  return Sharder(batch, mesh, cp_size(mesh), shard_primary, pad, std::move(microbatches));
}

Sharder prepare_packed_cp_inputs(const CPBatch& batch, const MeshPtr& mesh, int num_chunks,
                                 bool shard_primary, const PadOptions& pad) {
  check_format(batch, "thd", "prepare_packed_cp_inputs", "prepare_cp_inputs");
  auto microbatches = detail::thd_microbatches(batch, cp_size(mesh), num_chunks, pad);
  detail::check_batch_agrees(batch, mesh, num_chunks, pad);
  return Sharder(batch, mesh, cp_size(mesh), shard_primary, pad, std::move(microbatches));
}

}  // namespace cpkit
