// What each rank process runs: the optimized path on its own shard, over its CP mesh.
#include <torch/csrc/autograd/autograd.h>

#include "bundle.hpp"
#include "case_codec.hpp"
#include "convert.hpp"
#include "cpkit/optimized/ops.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_pool.hpp"
#include "tasks.hpp"

namespace cpkit::harness {

namespace {

using pool::Bundle;
using pool::TaskRegistrar;
using reference::harness::make_batch;
using reference::harness::random_floats;

// [rows, L] stream gathered back along the sequence: [rows, CP * L].
at::Tensor gather_sequence(const at::Tensor& local, const MeshPtr& mesh) {
  return gather_tokens(local.t().contiguous(), mesh, false).t().contiguous();
}

void add_shard(Bundle& out, const std::string& key, const LocalShard& s, const MeshPtr& mesh) {
  for (const auto& [name, t] : {std::pair{"labels", s.labels},
                                {"position_ids", s.position_ids},
                                {"document_ids", s.document_ids},
                                {"padding", s.padding}}) {
    out.add(key + name, t);
    out.add(key + "gathered." + name, gather_sequence(t, mesh));
  }
  out.add(key + "valid", s.valid);
  if (s.input_ids.defined()) out.add(key + "input_ids", s.input_ids);
  if (s.inputs_embeds.defined()) {
    out.add(key + "inputs_embeds", s.inputs_embeds);
    out.add(
        key + "gathered.inputs_embeds",
        gather_tokens(s.inputs_embeds.transpose(0, 1).contiguous(), mesh, false).transpose(0, 1));
  }
}

template <class Case>
std::string shard_task(const Case& c, const CPBatch& batch, bool packed, const MeshPtr& mesh) {
  const PadOptions pad{c.pad_multiple, c.pad_token_id};
  auto prepare = [&](bool shard_primary) {
    if constexpr (std::is_same_v<Case, PackedCase>)
      return prepare_packed_cp_inputs(batch, mesh, static_cast<int>(c.rows.size()), shard_primary,
                                      pad);
    else
      return prepare_cp_inputs(batch, mesh, c.num_chunks, shard_primary, pad);
  };
  const Sharder sharder = prepare(c.shard_primary);
  Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const std::string key = std::to_string(m) + ".";
    add_shard(out, key, sharder.local(m), mesh);
    if (!c.shard_primary) out.add(key + "cut", sharder.cut_spliced(m, sharder.global_primary(m)));
    if (packed) {
      out.add(key + "cu_seqlens", sharder.cu_seqlens(m));
      out.add(key + "cu_seqlens_padded", sharder.cu_seqlens_padded(m));
    }
  }
  return out.serialise();
}

const TaskRegistrar shard_bshd(kShardBshd, [](const std::string& p, const MeshPtr& mesh, int) {
  const BshdCase c = decode_bshd(p);
  return shard_task(c, to_cp_batch(make_batch(c)), false, mesh);
});

const TaskRegistrar shard_packed(kShardPacked, [](const std::string& p, const MeshPtr& mesh, int) {
  const PackedCase c = decode_packed(p);
  return shard_task(c, to_cp_batch(make_batch(c)), true, mesh);
});

// Every microbatch: local logits cut from the global ones (same seed as the harness), loss,
// backward; reply value and gradient.
template <class Case>
std::string loss_task(const Case& c, const Sharder& sharder, double softcap, const MeshPtr& mesh) {
  Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const LocalShard s = sharder.local(m);
    const int64_t rows = s.labels.size(0);
    const at::Tensor global =
        to_tensor(random_floats(rows * s.layout.padded_len, c.vocab, c.logit_scale, c.seed + 7 + m))
            .view({rows, s.layout.padded_len, c.vocab});
    const at::Tensor logits =
        global.narrow(1, s.layout.begin, s.layout.local_len).contiguous().requires_grad_(true);
    const at::Tensor loss = shifted_cp_loss(logits, s.labels, s.valid, mesh, {.softcap = softcap});
    const auto grad = torch::autograd::grad({loss}, {logits});
    out.add(std::to_string(m) + ".loss", loss);
    out.add(std::to_string(m) + ".grad", grad[0]);
  }
  return out.serialise();
}

const TaskRegistrar loss_bshd(kLossBshd, [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [softcap, rest] = split_first(p);
  const BshdCase c = decode_bshd(rest);
  const Sharder s = prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      {c.pad_multiple, c.pad_token_id});
  return loss_task(c, s, std::stod(softcap), mesh);
});

const TaskRegistrar loss_packed(kLossPacked, [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [softcap, rest] = split_first(p);
  const PackedCase c = decode_packed(rest);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, static_cast<int>(c.rows.size()),
                               true, {c.pad_multiple, c.pad_token_id});
  return loss_task(c, s, std::stod(softcap), mesh);
});

const TaskRegistrar gather(kGather, [](const std::string& p, const MeshPtr& mesh, int rank) {
  std::istringstream in(p);
  int64_t tokens = 0, features = 0;
  std::uint64_t seed = 0;
  in >> tokens >> features >> seed;
  const at::Tensor value =
      to_tensor(random_floats(tokens, features, 1, seed + rank)).requires_grad_(true);
  const at::Tensor gathered = gather_tokens(value, mesh, true);
  const at::Tensor upstream =
      to_tensor(random_floats(mesh->size() * tokens, features, 1, seed + 100 + rank)) *
      static_cast<float>(rank + 1);
  const auto grad = torch::autograd::grad({gathered}, {value}, {upstream});
  Bundle out;
  out.add("gathered", gathered);
  out.add("grad", grad[0]);
  return out.serialise();
});

const TaskRegistrar gather_mismatch(kGatherMismatch, [](const std::string&, const MeshPtr& mesh,
                                                        int rank) {
  gather_tokens(at::zeros({rank + 1, 2}), mesh, true);  // must raise on every rank
  return std::string("no error");
});

// Local queries attend to gathered keys/values under the SPEC 3 mask; dQ/dK/dV by autograd
// through gather_tokens' reduce-scatter.
const TaskRegistrar attention(kAttention, [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [head_text, rest] = split_first(p);
  const int64_t head = std::stoll(head_text);
  const PackedCase c = decode_packed(rest);
  const Sharder s = prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, 1, true,
                                             {c.pad_multiple, c.pad_token_id});
  const LocalShard shard = s.local(0);
  const int64_t T = shard.layout.padded_len, b = shard.layout.begin, n = shard.layout.local_len;
  auto local = [&](std::uint64_t offset) {
    return to_tensor(random_floats(T, head, 1, c.seed + offset)).narrow(0, b, n).contiguous();
  };
  const at::Tensor q = local(1).requires_grad_(true);
  const at::Tensor k = local(2).requires_grad_(true);
  const at::Tensor v = local(3).requires_grad_(true);
  const at::Tensor d_out = local(4);

  const at::Tensor k_all = gather_tokens(k, mesh, true);
  const at::Tensor v_all = gather_tokens(v, mesh, true);
  const at::Tensor pos_q = shard.position_ids.flatten(), doc_q = shard.document_ids.flatten();
  const at::Tensor pos_k = gather_tokens(pos_q, mesh, false);
  const at::Tensor doc_k = gather_tokens(doc_q, mesh, false);
  const at::Tensor pad_k = gather_tokens(shard.padding.flatten(), mesh, false);
  const at::Tensor allowed = (doc_q.unsqueeze(1) > 0) & (doc_q.unsqueeze(1) == doc_k.unsqueeze(0)) &
                             (pos_k.unsqueeze(0) <= pos_q.unsqueeze(1)) & (~pad_k).unsqueeze(0);
  const at::Tensor scores = at::matmul(q, k_all.t()) / std::sqrt(static_cast<double>(head));
  const at::Tensor masked = scores.masked_fill(~allowed, -INFINITY);
  // Rows with no allowed key give zeros (as the reference), not NaN.
  const at::Tensor any = allowed.any(1, true);
  const at::Tensor probs = at::where(any, at::softmax(masked.masked_fill(~any, 0), 1), 0.0);
  const at::Tensor out = at::matmul(probs, v_all);
  const auto grads = torch::autograd::grad({out}, {q, k, v}, {d_out});
  Bundle reply;
  reply.add("out", out);
  reply.add("dq", grads[0]);
  reply.add("dk", grads[1]);
  reply.add("dv", grads[2]);
  return reply.serialise();
});

}  // namespace
}  // namespace cpkit::harness
