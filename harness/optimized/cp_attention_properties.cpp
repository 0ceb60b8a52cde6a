// cp_attention (docs/spec.md section 4b) in real rank processes against the reference: every
// rank's output, log-sum-exp, dq, dk, dv (key gradients summed onto their owners through
// the backward's exchange) and d sinks equal the reference's, for every layout, sliding
// windows, GQA, sinks, soft cap and scale; each rank receives exactly the reference's needed
// keys (the bytes the op reports).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

struct Params {
  int key_heads = 1, group = 1, head_dim = 1, window = 0, softcap_tenths = 0, sinks = 0,
      scale_tenths = 0;
};

std::string encode_params(const Params& a) {
  char text[96];
  std::snprintf(text, sizeof text, "%d:%d:%d:%d:%d:%d:%d", a.key_heads, a.group, a.head_dim,
                a.window, a.softcap_tenths, a.sinks, a.scale_tenths);
  return text;
}

Params decode_params(const std::string& text) {
  Params a;
  std::sscanf(text.c_str(), "%d:%d:%d:%d:%d:%d:%d", &a.key_heads, &a.group, &a.head_dim, &a.window,
              &a.softcap_tenths, &a.sinks, &a.scale_tenths);
  return a;
}

// Both sides' inputs: one [T, D] matrix per head, from the case's seed.
reference::FloatMatrix head_input(const PackedCase& c, Input input, int head, Eigen::Index T,
                                  int d) {
  return random_floats(T, d, 1, input_seed(c.seed, input, head));
}

std::vector<double> sinks_of(const PackedCase& c, const Params& a) {
  std::vector<double> sinks;
  for (int h = 0; a.sinks != 0 && h < a.key_heads * a.group; ++h)
    sinks.push_back(static_cast<double>(static_cast<int>((c.seed >> (3 * h)) % 41) - 20) / 10.0);
  return sinks;
}

// [1, L, heads, D] at the rank's positions.
at::Tensor local_heads(const PackedCase& c, Input input, int heads, Eigen::Index T, int d,
                       const at::Tensor& positions) {
  std::vector<at::Tensor> all;
  for (int h = 0; h < heads; ++h) all.push_back(to_tensor(head_input(c, input, h, T, d)));
  return at::stack(all, 1).index_select(0, positions).unsqueeze(0);
}

const RankTask attention("cp_attention", [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [text, c] = decode_with<PackedCase, std::string>(p);
  const Params a = decode_params(text);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, 1, true, pad_of(options_of(c)));
  const LocalShard shard = s.local(0);
  const auto T = static_cast<Eigen::Index>(shard.layout.padded_len);
  const at::Tensor positions = layout_positions_of(shard.layout);
  const int hq = a.key_heads * a.group;
  const at::Tensor q =
      local_heads(c, Input::kQuery, hq, T, a.head_dim, positions).requires_grad_(true);
  const at::Tensor k =
      local_heads(c, Input::kKey, a.key_heads, T, a.head_dim, positions).requires_grad_(true);
  const at::Tensor v =
      local_heads(c, Input::kValue, a.key_heads, T, a.head_dim, positions).requires_grad_(true);
  const at::Tensor d_out = local_heads(c, Input::kAttentionGrad, hq, T, a.head_dim, positions);
  CpAttentionOptions options{a.scale_tenths / 10.0, a.softcap_tenths / 10.0, at::Tensor()};
  const std::vector<double> sinks = sinks_of(c, a);
  if (!sinks.empty()) options.sinks = at::tensor(sinks, at::kFloat).requires_grad_(true);
  const auto plan = std::make_shared<const AttentionPlan>(
      attention_plan(s, 0, cp_rank(mesh), static_cast<int64_t>(a.window)));
  const CpAttentionOutput out = cp_attention(q, k, v, plan, mesh, options);
  std::vector<at::Tensor> inputs{q, k, v};
  if (options.sinks.defined()) inputs.push_back(options.sinks);
  const auto grads = torch::autograd::grad({out.out}, inputs, {d_out});
  pool::Bundle reply;
  reply.add("out", out.out.squeeze(0).detach());
  reply.add("lse", out.lse.squeeze(0));
  reply.add("dq", grads[0].squeeze(0));
  reply.add("dk", grads[1].squeeze(0));
  reply.add("dv", grads[2].squeeze(0));
  reply.add("dsinks", options.sinks.defined() ? grads[3] : at::empty({0}));
  reply.add("bytes", at::tensor({cp_attention_received_bytes(*plan, a.key_heads, a.head_dim, 4)}));
  return reply.serialise();
});

RC_GTEST_PROP(OptimizedCpAttention, EveryLayoutEqualsReference, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  c.layout = *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_packed_layout());
  Params a;
  a.key_heads = *rc::gen::inRange(1, 3);
  a.group = *rc::gen::inRange(1, 3);
  a.head_dim = *rc::gen::inRange(1, 6);
  a.window = *rc::gen::element(0, 0, 1, 3, 8);
  a.softcap_tenths = *rc::gen::element(0, 0, 20);
  a.sinks = *rc::gen::element(0, 1);
  a.scale_tenths = *rc::gen::element(0, 0, 3);
  const auto bundles = attention.run(c.cp, encode_with(encode_params(a), c));

  const reference::Sharder s = reference::prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const auto T = static_cast<Eigen::Index>(s.global(0).padded_len);
  const int hq = a.key_heads * a.group;
  reference::AttentionOptions options;
  options.window = a.window;
  options.softcap = a.softcap_tenths / 10.0;
  options.scale = a.scale_tenths / 10.0;
  options.sinks = sinks_of(c, a);
  std::vector<reference::RankHeads> ranks;
  std::vector<std::vector<reference::FloatMatrix>> d_out;
  std::vector<reference::TokenMeta> metas;
  for (int r = 0; r < c.cp; ++r) {
    const reference::LocalShard l = s.local(0, r);
    auto cut = [&](Input input, int heads) {
      std::vector<reference::FloatMatrix> out;
      for (int h = 0; h < heads; ++h) {
        const reference::FloatMatrix all = head_input(c, input, h, T, a.head_dim);
        reference::FloatMatrix mine(static_cast<Eigen::Index>(l.layout.positions.size()),
                                    a.head_dim);
        for (std::size_t i = 0; i < l.layout.positions.size(); ++i)
          mine.row(static_cast<Eigen::Index>(i)) =
              all.row(static_cast<Eigen::Index>(l.layout.positions[i]));
        out.push_back(mine);
      }
      return out;
    };
    metas.push_back({l.position_ids.row(0).transpose(), l.document_ids.row(0).transpose(),
                     l.padding.row(0).transpose()});
    ranks.push_back({cut(Input::kQuery, hq), cut(Input::kKey, a.key_heads),
                     cut(Input::kValue, a.key_heads), metas.back()});
    d_out.push_back(cut(Input::kAttentionGrad, hq));
  }
  const auto out = reference::cp_attention(ranks, options);
  const auto grads = reference::cp_attention_backward(ranks, d_out, options);
  const reference::NeededKeys needed = reference::needed_keys(metas, options.window);
  auto stacked = [](const std::vector<reference::FloatMatrix>& heads) {
    std::vector<at::Tensor> all;
    for (const auto& m : heads) all.push_back(to_tensor(m));
    return at::stack(all, 1);  // [L, heads, D]
  };
  for (int r = 0; r < c.cp; ++r) {
    const pool::Bundle& b = bundles[static_cast<std::size_t>(r)];
    const std::string on = " on rank " + std::to_string(r);
    require_near(b.get("out"), stacked(out[r].out), kAttentionAtol, kAttentionRtol, "output" + on);
    std::vector<at::Tensor> lse;
    for (const auto& l : out[r].lse)
      lse.push_back(at::tensor(std::vector<double>(l.data(), l.data() + l.size())).to(at::kFloat));
    require_near(b.get("lse"), at::stack(lse), kAttentionAtol, kAttentionRtol, "lse" + on);
    require_near(b.get("dq"), stacked(grads[r].dq), kAttentionAtol, kAttentionRtol, "dq" + on);
    require_near(b.get("dk"), stacked(grads[r].dk), kAttentionAtol * c.cp * a.group, kAttentionRtol,
                 "dk" + on);
    require_near(b.get("dv"), stacked(grads[r].dv), kAttentionAtol * c.cp * a.group, kAttentionRtol,
                 "dv" + on);
    if (!options.sinks.empty())
      require_near(b.get("dsinks"), at::tensor(grads[r].dsinks, at::kDouble).to(at::kFloat),
                   kAttentionAtol * T, kAttentionRtol, "d sinks" + on);
    std::int64_t keys = 0;
    for (int o = 0; o < c.cp; ++o)
      keys += static_cast<std::int64_t>(
          needed[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)].size());
    RC_ASSERT(b.get("bytes").item<int64_t>() == 2 * keys * a.key_heads * a.head_dim * 4);
  }
}

}  // namespace
}  // namespace cpkit::harness
