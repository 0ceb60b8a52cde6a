// cp_attention as torch.ops.cpkit.*: a shard's attention plan as tensors, and the op's
// forward and backward halves (cpkit/optimized/cp_attention.hpp). Autograd and fake kernels
// are registered from Python (cpkit/_ops.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/cp_attention.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// An AttentionPlan as int64 CPU tensors: [cp, rank, rows, L, window], then per-peer send
// counts and the send lists concatenated, the same for recv, then slots, begin and end of
// the all, own and remote key indexes. Only this file writes and reads the encoding.
constexpr std::size_t kPlanTensors = 14;

at::Tensor longs(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }

void encode_lists(const std::vector<std::vector<int64_t>>& lists, std::vector<at::Tensor>& out) {
  std::vector<int64_t> counts, flat;
  for (const auto& list : lists) {
    counts.push_back(static_cast<int64_t>(list.size()));
    flat.insert(flat.end(), list.begin(), list.end());
  }
  out.push_back(longs(counts));
  out.push_back(longs(flat));
}

std::vector<at::Tensor> encode(const AttentionPlan& p) {
  std::vector<at::Tensor> out{longs({p.cp_size, p.rank, p.rows, p.local_len, p.window})};
  encode_lists(p.send, out);
  encode_lists(p.recv, out);
  for (const KeyIndex* index : {&p.all_keys, &p.own_keys, &p.remote_keys}) {
    out.push_back(longs(index->slots));
    out.push_back(longs(index->begin));
    out.push_back(longs(index->end));
  }
  return out;
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  return {c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel()};
}

std::vector<std::vector<int64_t>> decode_lists(const at::Tensor& counts, const at::Tensor& flat) {
  const std::vector<int64_t> n = values(counts), all = values(flat);
  std::vector<std::vector<int64_t>> lists;
  std::size_t at = 0;
  for (const int64_t count : n) {
    if (count < 0 || at + static_cast<std::size_t>(count) > all.size())
      raise("plan", "is not an attention plan (list counts past the lists)");
    lists.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                       all.begin() + static_cast<std::ptrdiff_t>(at + count));
    at += static_cast<std::size_t>(count);
  }
  return lists;
}

AttentionPlan decode(const std::vector<at::Tensor>& t) {
  if (t.size() != kPlanTensors || t[0].numel() != 5)
    raise("plan", "is not an attention plan: pass Sharder.attention_plan(m) as it is (", t.size(),
          " tensors, expected ", kPlanTensors, ")");
  const std::vector<int64_t> head = values(t[0]);
  AttentionPlan p;
  p.cp_size = static_cast<int>(head[0]);
  p.rank = static_cast<int>(head[1]);
  p.rows = head[2];
  p.local_len = head[3];
  p.window = head[4];
  p.send = decode_lists(t[1], t[2]);
  p.recv = decode_lists(t[3], t[4]);
  std::size_t at = 5;
  for (KeyIndex* index : {&p.all_keys, &p.own_keys, &p.remote_keys}) {
    index->slots = values(t[at++]);
    index->begin = values(t[at++]);
    index->end = values(t[at++]);
    if (index->begin.size() != static_cast<std::size_t>(p.rows * p.local_len) ||
        index->end.size() != index->begin.size())
      raise("plan", "is not an attention plan (key ranges for ", index->begin.size(),
            " queries, expected ", p.rows * p.local_len, ")");
  }
  if (p.send.size() != static_cast<std::size_t>(p.cp_size) ||
      p.recv.size() != static_cast<std::size_t>(p.cp_size))
    raise("plan", "is not an attention plan (", p.send.size(), " peers for CP ", p.cp_size, ")");
  return p;
}

CpAttentionOptions options_of(const std::optional<at::Tensor>& sinks, double scale,
                              double softcap) {
  return {scale, softcap, sinks.value_or(at::Tensor())};
}

std::vector<at::Tensor> attention_plan_op(
    const std::optional<at::Tensor>& input_ids, const std::optional<at::Tensor>& inputs_embeds,
    const at::Tensor& labels, const std::optional<at::Tensor>& position_ids,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& seq_lens,
    const std::optional<at::Tensor>& seq_lens_padded, const std::string& qkv_format,
    int64_t cp_size, int64_t rank, int64_t num_chunks, int64_t pad_multiple, int64_t microbatch,
    const std::string& layout, int64_t window, std::optional<double> balance_slack) {
  return checked([&] {
    const Sharder sharder =
        sharder_for(batch_of(input_ids, inputs_embeds, labels, position_ids, attention_mask,
                             seq_lens, seq_lens_padded, qkv_format),
                    cp_size, rank, num_chunks, pad_multiple, layout, balance_slack);
    return encode(
        attention_plan(sharder, static_cast<int>(microbatch), static_cast<int>(rank), window));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cp_attention_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& sinks, const std::vector<at::Tensor>& plan,
    const std::string& group_name, double scale, double softcap) {
  return checked([&] {
    const CpAttentionForward f = cp_attention_forward(
        q, k, v, decode(plan), mesh_for(group_name, q.device()), options_of(sinks, scale, softcap));
    return std::make_tuple(f.values.out, f.values.lse.contiguous(), f.received);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cp_attention_backward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& sinks, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& received, const at::Tensor& grad_out, const std::vector<at::Tensor>& plan,
    const std::string& group_name, double scale, double softcap) {
  return checked([&] {
    const CpAttentionGrads g =
        cp_attention_backward(q, k, v, {{out, lse}, received}, grad_out, decode(plan),
                              mesh_for(group_name, q.device()), options_of(sinks, scale, softcap));
    return std::make_tuple(
        g.q, g.k, g.v, g.sinks.defined() ? g.sinks : at::empty({0}, q.options().dtype(at::kFloat)));
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  // This rank's attention plan of a microbatch (spec 4b), as tensors; no communication.
  m.def(
      "attention_plan(Tensor? input_ids, Tensor? inputs_embeds, Tensor labels, "
      "Tensor? position_ids, Tensor? attention_mask, Tensor? seq_lens, Tensor? seq_lens_padded, "
      "str qkv_format, int cp_size, int rank, int num_chunks, int pad_multiple, int microbatch, "
      "str layout, int window, float? balance_slack=None) -> Tensor[]",
      &attention_plan_op);
  // Returns (out, lse, received); received (the keys and values that came in) feeds the
  // backward.
  m.def(
      "cp_attention(Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor[] plan, str group_name, "
      "float scale, float softcap) -> (Tensor, Tensor, Tensor)");
  m.def(
      "cp_attention_backward(Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor out, "
      "Tensor lse, Tensor received, Tensor grad_out, Tensor[] plan, str group_name, float scale, "
      "float softcap) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cpkit, CPU, m) {
  m.impl("cp_attention", &cp_attention_op);
  m.impl("cp_attention_backward", &cp_attention_backward_op);
}

TORCH_LIBRARY_IMPL(cpkit, CUDA, m) {  // the library picks the CUDA kernels itself
  m.impl("cp_attention", &cp_attention_op);
  m.impl("cp_attention_backward", &cp_attention_backward_op);
}

}  // namespace cpkit::python
