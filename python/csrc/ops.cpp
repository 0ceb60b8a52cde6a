// cpkit's operations in PyTorch's dispatcher as torch.ops.cpkit.*: the schemas, and CPU and
// CUDA kernels that call the optimized library (the code the property harness proves). The
// process group travels as its name (a str), as PyTorch's functional collectives pass it, so
// torch.compile traces the ops without a graph break. Autograd and fake (meta) kernels are
// registered from Python (cpkit/_ops.py); nothing here computes anything of its own.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/offsets.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "cpkit/optimized/validation.hpp"
#include "layout_codec.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// An op's output never aliases its input (its schema promises a fresh tensor): at CP = 1
// or for a cut that is already contiguous the library returns a view, copied here.
at::Tensor fresh(const at::Tensor& out, const at::Tensor& input) {
  return input.defined() && out.is_alias_of(input) ? out.clone() : out;
}

// The plan a loss was cut with: none (contiguous) or the shard's "layout" tensor.
std::shared_ptr<const LayoutPlan> plan_or_none(const std::optional<at::Tensor>& layout) {
  return layout.has_value() ? plan_from_tensor(*layout, "layout") : nullptr;
}

at::Tensor gather_tokens_op(const at::Tensor& value, const std::string& group_name, int64_t dim) {
  return checked([&] {
    return fresh(gather_tokens(value, mesh_for(group_name, value.device()), false, dim), value);
  });
}

at::Tensor reduce_scatter_tokens_op(const at::Tensor& grad, const std::string& group_name,
                                    int64_t dim) {
  return checked([&] {
    return fresh(reduce_scatter_tokens(grad, mesh_for(group_name, grad.device()), dim), grad);
  });
}

std::tuple<at::Tensor, at::Tensor> shifted_cp_loss_op(const at::Tensor& logits,
                                                      const at::Tensor& labels,
                                                      const at::Tensor& valid,
                                                      const std::string& group_name, double softcap,
                                                      const std::optional<at::Tensor>& layout) {
  return checked([&] {
    LossWithGrad out =
        shifted_cp_loss_with_grad(logits, labels, valid, mesh_for(group_name, logits.device()),
                                  {.softcap = softcap, .layout = plan_or_none(layout)});
    return std::make_tuple(out.loss, out.grad_logits);
  });
}

void scale_loss_gradient_op(const at::Tensor& grad_logits, const at::Tensor& upstream) {
  checked([&] { scale_loss_gradient_(grad_logits, upstream); });
}

// A gradient (or output) not asked for comes back as an empty [0] tensor (an op returns no
// None).
at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : like.new_empty({0});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> shifted_cp_linear_loss_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
    const at::Tensor& valid, const std::string& group_name, double softcap, int64_t chunk_rows,
    bool grad_hidden, bool grad_weight, const std::optional<at::Tensor>& layout,
    const std::string& logits_precision) {
  return checked([&] {
    LinearLossWithGrad out = shifted_cp_linear_loss_with_grad(
        hidden, weight, labels, valid, mesh_for(group_name, hidden.device()),
        {.softcap = softcap,
         .chunk_rows = chunk_rows,
         .logits_precision = parse_logits_precision(logits_precision),
         .layout = plan_or_none(layout)},
        {.hidden = grad_hidden, .weight = grad_weight});
    return std::make_tuple(out.loss, or_empty(out.grad_hidden, hidden),
                           or_empty(out.grad_weight, weight));
  });
}

TokenLogprobsOptions logprob_options(double softcap, double temperature, bool entropy,
                                     const std::string& logits_precision, int64_t chunk_rows,
                                     const std::optional<at::Tensor>& layout) {
  return {.softcap = softcap,
          .temperature = temperature,
          .entropy = entropy,
          .logits_precision = parse_logits_precision(logits_precision),
          .chunk_rows = chunk_rows,
          .layout = plan_or_none(layout)};
}

// The values, then what the backward needs (targets, per-position statistics); an entropy
// not asked for is an empty [0] tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> token_logprobs_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
    const at::Tensor& valid, const std::string& group_name, double softcap, double temperature,
    bool entropy, const std::string& logits_precision, int64_t chunk_rows,
    const std::optional<at::Tensor>& layout) {
  return checked([&] {
    TokenLogprobsForward out = token_logprobs_forward(
        hidden, weight, labels, valid, mesh_for(group_name, hidden.device()),
        logprob_options(softcap, temperature, entropy, logits_precision, chunk_rows, layout));
    return std::make_tuple(out.values.logprobs, or_empty(out.values.entropy, hidden),
                           out.values.has_target, out.targets, out.stats);
  });
}

std::tuple<at::Tensor, at::Tensor> token_logprobs_backward_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
    const at::Tensor& stats, const std::optional<at::Tensor>& grad_logprobs,
    const std::optional<at::Tensor>& grad_entropy, double softcap, double temperature,
    const std::string& logits_precision, int64_t chunk_rows, bool grad_hidden, bool grad_weight) {
  return checked([&] {
    const TokenLogprobsGrads g = token_logprobs_backward(
        hidden, weight, targets, stats, grad_logprobs.value_or(at::Tensor()),
        grad_entropy.value_or(at::Tensor()),
        logprob_options(softcap, temperature, false, logits_precision, chunk_rows, std::nullopt),
        grad_hidden, grad_weight);
    return std::make_tuple(or_empty(g.hidden, hidden), or_empty(g.weight, weight));
  });
}

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

bool leaves_gradient_as_is_op(const at::Tensor& upstream) {
  return checked([&] { return leaves_gradient_as_is(upstream); });
}

void check_backward_once_op(bool done) {
  checked([&] { check_backward_once(done); });
}

// The value-check switch by name: "cpu_only" (the default), "always" or "never".
void set_value_checks_op(const std::string& mode) {
  checked([&] {
    if (mode == "cpu_only")
      set_value_checks(ValueChecks::kCpuOnly);
    else if (mode == "always")
      set_value_checks(ValueChecks::kAlways);
    else if (mode == "never")
      set_value_checks(ValueChecks::kNever);
    else
      raise("mode", "must be \"cpu_only\", \"always\" or \"never\", got \"", mode, "\"");
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

TORCH_LIBRARY(cpkit, m) {
  m.def("gather_tokens(Tensor value, str group_name, int dim=0) -> Tensor");
  m.def("reduce_scatter_tokens(Tensor grad, str group_name, int dim=0) -> Tensor");
  m.def(
      "shifted_cp_loss(Tensor logits, Tensor labels, Tensor valid, str group_name, float softcap, "
      "Tensor? layout=None) -> (Tensor, Tensor)");
  // The loss's backward: scales the saved gradient in place (nothing when the upstream is 1).
  m.def("scale_loss_gradient_(Tensor(a!) grad_logits, Tensor upstream) -> ()");
  m.def(
      "shifted_cp_linear_loss(Tensor hidden, Tensor weight, Tensor labels, Tensor valid, "
      "str group_name, float softcap, int chunk_rows, bool grad_hidden, bool grad_weight, "
      "Tensor? layout=None, str logits_precision=\"input\") -> (Tensor, Tensor, Tensor)");
  // Returns (logprobs, entropy, has_target, targets, stats); the last two feed the backward.
  m.def(
      "token_logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor valid, str group_name, "
      "float softcap, float temperature, bool entropy, str logits_precision, int chunk_rows, "
      "Tensor? layout=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "token_logprobs_backward(Tensor hidden, Tensor weight, Tensor targets, Tensor stats, "
      "Tensor? grad_logprobs, Tensor? grad_entropy, float softcap, float temperature, "
      "str logits_precision, int chunk_rows, bool grad_hidden, bool grad_weight) "
      "-> (Tensor, Tensor)");
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
  // Process-wide: not a tensor op, called outside any traced region.
  m.def("set_value_checks(str mode) -> ()", &set_value_checks_op);
  m.def(
      "cut_spliced(Tensor spliced, Tensor layout, int rank, int rows, int local_len, float fill) "
      "-> Tensor");
  // The rules a Python backward shares with the C++ API's (loss.hpp); eager only.
  m.def("leaves_gradient_as_is(Tensor upstream) -> bool", &leaves_gradient_as_is_op);
  m.def("check_backward_once(bool done) -> ()", &check_backward_once_op);
  m.def("cut_spliced_backward(Tensor grad, Tensor layout, int rank, int seq_len) -> Tensor");
}

// The library's functions take CPU and CUDA tensors alike and pick their kernels themselves.
#define CPKIT_REGISTER_KERNELS(KEY)                                 \
  TORCH_LIBRARY_IMPL(cpkit, KEY, m) {                               \
    m.impl("gather_tokens", &gather_tokens_op);                     \
    m.impl("reduce_scatter_tokens", &reduce_scatter_tokens_op);     \
    m.impl("shifted_cp_loss", &shifted_cp_loss_op);                 \
    m.impl("scale_loss_gradient_", &scale_loss_gradient_op);        \
    m.impl("shifted_cp_linear_loss", &shifted_cp_linear_loss_op);   \
    m.impl("token_logprobs", &token_logprobs_op);                   \
    m.impl("token_logprobs_backward", &token_logprobs_backward_op); \
    m.impl("shard", &shard_op);                                     \
    m.impl("attention_offsets", &attention_offsets_op);             \
    m.impl("cut_spliced", &cut_spliced_op);                         \
    m.impl("cut_spliced_backward", &cut_spliced_backward_op);       \
    m.impl("restore_index", &restore_index_op);                     \
  }
CPKIT_REGISTER_KERNELS(CPU)
CPKIT_REGISTER_KERNELS(CUDA)

}  // namespace cpkit::python
