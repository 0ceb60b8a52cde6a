// Sharding and layouts as torch.ops.cpkit.*: the shard op (every stream of a microbatch cut
// for this rank), the varlen offsets, the layout summaries the fake kernels read,
// restore_order's permutation and the cut of spliced embeddings with its backward
// (cpkit/optimized/sharder.hpp, layout.hpp, offsets.hpp). Fake kernels: cpkit/_ops.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/offsets.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "layout_codec.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// kind: "none", "tensor", "tensor_list", "string" or "other" (the Python value's kind).
void check_batch_field_op(const std::string& name, const std::string& kind,
                          const std::string& got) {
  checked([&] {
    const BatchValue k = kind == "none"          ? BatchValue::kNone
                         : kind == "tensor"      ? BatchValue::kTensor
                         : kind == "tensor_list" ? BatchValue::kTensorList
                         : kind == "string"      ? BatchValue::kString
                                                 : BatchValue::kOther;
    check_batch_field(name, k, got);
  });
}

// `packed`: the caller's function (prepare_packed_cp_inputs or prepare_cp_inputs), which
// checks the batch's qkv_format.
Sharder sharder_on(const CPBatch& batch, bool packed, const MeshPtr& mesh, int64_t num_chunks,
                   bool shard_primary, int64_t pad_multiple, int64_t pad_token_id,
                   const std::string& layout, std::optional<double> balance_slack) {
  const PadOptions pad = pad_options(pad_multiple, pad_token_id, layout, balance_slack);
  return packed ? prepare_packed_cp_inputs(batch, mesh, static_cast<int>(num_chunks), shard_primary,
                                           pad)
                : prepare_cp_inputs(batch, mesh, static_cast<int>(num_chunks), shard_primary, pad);
}

// The shard op's tensors per microbatch, in this order, the one place it is written: Python
// reads it (shard_streams) to name them. primary: ids or embeddings, empty when not sharded;
// layout: the plan (layout_codec.hpp); the cu_seqlens pair is empty for BSHD.
constexpr std::array<const char*, 9> kShardStreams = {
    "primary", "labels", "position_ids", "document_ids",     "padding",
    "valid",   "layout", "cu_seqlens",   "cu_seqlens_padded"};

std::vector<std::string> shard_streams_op() { return {kShardStreams.begin(), kShardStreams.end()}; }

std::vector<at::Tensor> shard_op(
    const std::optional<at::Tensor>& input_ids, const std::optional<at::Tensor>& inputs_embeds,
    const at::Tensor& labels, const std::optional<at::Tensor>& position_ids,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& seq_lens,
    const std::optional<at::Tensor>& seq_lens_padded, at::TensorList images,
    const std::string& qkv_format, bool packed, const std::string& group_name, int64_t num_chunks,
    bool shard_primary, int64_t pad_multiple, int64_t pad_token_id, const std::string& layout,
    std::optional<double> balance_slack) {
  return checked([&] {
    // Through the mesh: the ranks check that they shard the same batch (sharder.hpp).
    const Sharder sharder =
        sharder_on(batch_of(input_ids, inputs_embeds, labels, position_ids, attention_mask,
                            seq_lens, seq_lens_padded, qkv_format, images.vec()),
                   packed, mesh_for(group_name, labels.device()), num_chunks, shard_primary,
                   pad_multiple, pad_token_id, layout, balance_slack);
    const int rank = sharder.rank();
    // A fresh empty tensor for each absent output: outputs never alias each other.
    const auto none = [&] { return at::empty({0}, labels.options()); };
    std::vector<at::Tensor> out;
    for (int m = 0; m < sharder.num_microbatches(); ++m) {
      const LocalShard s = sharder.local(m, rank);
      const at::Tensor primary = s.input_ids.defined() ? fresh(s.input_ids, *input_ids)
                                 : s.inputs_embeds.defined()
                                     ? fresh(s.inputs_embeds, *inputs_embeds)
                                     : none();
      const std::unordered_map<std::string, at::Tensor> named = {
          {"primary", primary},
          {"labels", fresh(s.labels, labels)},
          {"position_ids", s.position_ids},
          {"document_ids", s.document_ids},
          {"padding", s.padding},
          {"valid", s.valid},
          {"layout", plan_to_tensor(*s.layout.plan)},
          {"cu_seqlens", packed ? sharder.cu_seqlens(m) : none()},
          {"cu_seqlens_padded", packed ? sharder.cu_seqlens_padded(m) : none()}};
      for (const char* name : kShardStreams) out.push_back(named.at(name));
    }
    return out;
  });
}

// Varlen attention offsets of one microbatch (offsets.hpp): cu_seqlens_q, cu_seqlens_k
// (int32, on the batch's device), [max_seqlen_q, max_seqlen_k, k_begin, k_end] and k_index
// (int64; empty for the contiguous layout).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_offsets_op(
    const std::optional<at::Tensor>& input_ids, const std::optional<at::Tensor>& inputs_embeds,
    const at::Tensor& labels, const std::optional<at::Tensor>& position_ids,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& seq_lens,
    const std::optional<at::Tensor>& seq_lens_padded, const std::string& qkv_format,
    int64_t cp_size, int64_t rank, int64_t num_chunks, int64_t pad_multiple, int64_t microbatch,
    const std::string& layout, std::optional<double> balance_slack) {
  return checked([&] {
    const Sharder sharder =
        sharder_for(batch_of(input_ids, inputs_embeds, labels, position_ids, attention_mask,
                             seq_lens, seq_lens_padded, qkv_format),
                    cp_size, rank, num_chunks, pad_multiple, layout, balance_slack);
    const AttentionOffsets o =
        attention_offsets(sharder, static_cast<int>(microbatch), static_cast<int>(rank));
    return std::make_tuple(o.cu_seqlens_q, o.cu_seqlens_k,
                           at::tensor({o.max_seqlen_q, o.max_seqlen_k, o.k_begin, o.k_end}),
                           o.k_index.defined() ? o.k_index : at::empty({0}, at::kLong));
  });
}

// layout_summary of rank's shard of seq_len tokens; "balanced" plans from a packed row's
// slot lengths, and without them gives the three lengths alone (what the fake kernels need).
std::vector<int64_t> shard_layout_op(int64_t seq_len, int64_t cp_size, int64_t rank,
                                     int64_t pad_multiple, const std::string& layout,
                                     const std::optional<std::vector<int64_t>>& slot_lens,
                                     std::optional<double> balance_slack) {
  return checked([&] {
    const LayoutKind kind = layout_kind(layout);
    if (kind == LayoutKind::kBalanced && slot_lens.has_value()) {
      const auto plan = std::make_shared<const LayoutPlan>(
          plan_balanced(*slot_lens, seq_len, static_cast<int>(cp_size),
                        static_cast<int>(pad_multiple), balance_slack_of(balance_slack)));
      return layout_summary(layout_of(plan, static_cast<int>(rank)));
    }
    if (kind == LayoutKind::kBalanced) {
      if (rank < 0 || rank >= cp_size) raise("rank", "must be in [0, ", cp_size, "), got ", rank);
      const int64_t padded = layout_padded_length(kind, seq_len, static_cast<int>(cp_size),
                                                  static_cast<int>(pad_multiple));
      return std::vector<int64_t>{seq_len, padded, padded / cp_size};
    }
    return layout_summary(shard_layout(seq_len, static_cast<int>(cp_size), static_cast<int>(rank),
                                       static_cast<int>(pad_multiple), kind));
  });
}

std::vector<int64_t> layout_fragments_op(const at::Tensor& layout, int64_t rank) {
  return checked([&] {
    return layout_summary(layout_of(plan_from_tensor(layout, "layout"), static_cast<int>(rank)));
  });
}

// restore_order's check of `local` and its permutation (layout.hpp restore_index) on local's
// device: a copy of the library's cached tensor (an output never aliases a cache).
at::Tensor restore_index_op(const at::Tensor& layout, const at::Tensor& local) {
  return checked([&] {
    const auto plan = plan_from_tensor(layout, "layout");
    check_restore_input(local, *plan);
    return restore_index_tensor(*plan, local.device()).clone();
  });
}

// Rank's Layout in the plan, checking the caller's local length (the fake kernel's shape).
Layout rank_layout(const at::Tensor& layout, int64_t rank, int64_t local_len) {
  Layout l = layout_of(plan_from_tensor(layout, "layout"), static_cast<int>(rank));
  if (local_len != l.local_len)
    raise("local_len", "is ", local_len, " but the layout gives each rank ", l.local_len);
  return l;
}

at::Tensor cut_spliced_op(const at::Tensor& spliced, const at::Tensor& layout, int64_t rank,
                          int64_t rows, int64_t local_len, double fill) {
  return checked([&] {
    const Layout l = rank_layout(layout, rank, local_len);
    check_spliced(spliced, rows, l);
    return fresh(cut_columns(spliced, l, fill), spliced);
  });
}

at::Tensor cut_spliced_backward_op(const at::Tensor& grad, const at::Tensor& layout, int64_t rank,
                                   int64_t seq_len) {
  return checked([&] {
    if (grad.dim() < 2) raise("grad", "must be [rows, L, ...], got ", grad.dim(), " dimensions");
    const Layout l = rank_layout(layout, rank, grad.size(1));
    if (seq_len != l.seq_len)
      raise("seq_len", "is ", seq_len, " but the layout was planned for ", l.seq_len);
    return cut_columns_backward(grad, l);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  m.def(
      "shard(Tensor? input_ids, Tensor? inputs_embeds, Tensor labels, Tensor? position_ids, "
      "Tensor? attention_mask, Tensor? seq_lens, Tensor? seq_lens_padded, Tensor[] images, "
      "str qkv_format, bool packed, str group_name, int num_chunks, bool shard_primary, "
      "int pad_multiple, int pad_token_id, str layout=\"contiguous\", "
      "float? balance_slack=None) -> Tensor[]");
  // A batch dict's field through CPBatch's own check (batch.hpp); eager only.
  m.def("check_batch_field(str name, str kind, str got) -> ()", &check_batch_field_op);
  m.def("shard_streams() -> str[]", &shard_streams_op);  // the names of shard's outputs
  m.def(
      "attention_offsets(Tensor? input_ids, Tensor? inputs_embeds, Tensor labels, "
      "Tensor? position_ids, Tensor? attention_mask, Tensor? seq_lens, Tensor? seq_lens_padded, "
      "str qkv_format, int cp_size, int rank, int num_chunks, int pad_multiple, int microbatch, "
      "str layout=\"contiguous\", float? balance_slack=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // [seq_len, padded_len, local_len, then the rank's fragments as begin, end pairs]: the
  // shapes the fake kernels report come from the library's own rule.
  m.def(
      "shard_layout(int seq_len, int cp_size, int rank, int pad_multiple, "
      "str layout=\"contiguous\", int[]? slot_lens=None, float? balance_slack=None) -> int[]",
      &shard_layout_op);
  // The same summary of a shard's layout plan; and restore_order's permutation of it.
  m.def("layout_fragments(Tensor layout, int rank) -> int[]", &layout_fragments_op);
  m.def("restore_index(Tensor layout, Tensor local) -> Tensor");
  m.def(
      "cut_spliced(Tensor spliced, Tensor layout, int rank, int rows, int local_len, float fill) "
      "-> Tensor");
  m.def("cut_spliced_backward(Tensor grad, Tensor layout, int rank, int seq_len) -> Tensor");
}

#define CPKIT_REGISTER_KERNELS(KEY)                           \
  TORCH_LIBRARY_IMPL(cpkit, KEY, m) {                         \
    m.impl("shard", &shard_op);                               \
    m.impl("attention_offsets", &attention_offsets_op);       \
    m.impl("cut_spliced", &cut_spliced_op);                   \
    m.impl("cut_spliced_backward", &cut_spliced_backward_op); \
    m.impl("restore_index", &restore_index_op);               \
  }
CPKIT_REGISTER_KERNELS(CPU)
CPKIT_REGISTER_KERNELS(CUDA)

}  // namespace cpkit::python
