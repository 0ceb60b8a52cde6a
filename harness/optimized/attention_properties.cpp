// docs/spec.md section 3 (the attention mask) on the optimized path in real rank processes: masked
// CP attention, with keys and values through gather_tokens, equals the reference's output and
// dQ/dK/dV.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

// One of Q, K, V or the output gradient: the rows [begin, begin + n) of a [T, head] matrix.
reference::FloatMatrix attention_input(const PackedCase& c, Input input, Eigen::Index T,
                                       Eigen::Index head, Eigen::Index begin, Eigen::Index n) {
  return random_floats(T, head, 1, input_seed(c.seed, input)).middleRows(begin, n);
}

// Local queries attend to gathered keys/values under the SPEC 3 mask; dQ/dK/dV by autograd
// through gather_tokens' reduce-scatter. Payload: head then a one-row packed case.
const RankTask attention("attention", [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [head, c] = decode_with<PackedCase, int64_t>(p);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, 1, true, pad_of(options_of(c)));
  const LocalShard shard = s.local(0);
  const int64_t T = shard.layout.padded_len, b = shard.layout.fragments.front().begin,
                n = shard.layout.local_len;
  auto local = [&](Input input) { return to_tensor(attention_input(c, input, T, head, b, n)); };
  const at::Tensor q = local(Input::kQuery).requires_grad_(true);
  const at::Tensor k = local(Input::kKey).requires_grad_(true);
  const at::Tensor v = local(Input::kValue).requires_grad_(true);
  const at::Tensor d_out = local(Input::kAttentionGrad);

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
  pool::Bundle reply;
  reply.add("out", out);
  reply.add("dq", grads[0]);
  reply.add("dk", grads[1]);
  reply.add("dv", grads[2]);
  return reply.serialise();
});

RC_GTEST_PROP(OptimizedAttention, CpAttentionEqualsReference, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  const int head = *rc::gen::inRange(1, 5);
  const auto bundles = attention.run(c.cp, encode_with(head, c));
  const reference::Sharder s = reference::prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const auto T = s.global(0).padded_len;
  std::vector<reference::RankAttention> ranks;
  std::vector<reference::FloatMatrix> d_out;
  for (int r = 0; r < c.cp; ++r) {
    const reference::LocalShard l = s.local(0, r);
    const auto b = l.layout.begin, n = l.layout.local_len;
    auto cut = [&](Input input) { return attention_input(c, input, T, head, b, n); };
    ranks.push_back({cut(Input::kQuery),
                     cut(Input::kKey),
                     cut(Input::kValue),
                     {l.position_ids.row(0).transpose(), l.document_ids.row(0).transpose(),
                      l.padding.row(0).transpose()}});
    d_out.push_back(cut(Input::kAttentionGrad));
  }
  const auto out = reference::cp_attention(ranks);
  const auto grads = reference::cp_attention_backward(ranks, d_out);
  for (int r = 0; r < c.cp; ++r) {
    const std::string on = " on rank " + std::to_string(r);
    require_near(bundles[r].get("out"), to_tensor(out[r]), kAttentionAtol, kAttentionRtol,
                 "output" + on);
    require_near(bundles[r].get("dq"), to_tensor(grads[r].dq), kAttentionAtol, kAttentionRtol,
                 "dQ" + on);
    require_near(bundles[r].get("dk"), to_tensor(grads[r].dk), kAttentionAtol * c.cp,
                 kAttentionRtol, "dK" + on);
    require_near(bundles[r].get("dv"), to_tensor(grads[r].dv), kAttentionAtol * c.cp,
                 kAttentionRtol, "dV" + on);
  }
}

}  // namespace
}  // namespace cpkit::harness
