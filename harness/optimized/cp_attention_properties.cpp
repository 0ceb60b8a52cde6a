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

// Both sides' inputs: one [T, D] matrix per row and head, from the case's seed.
reference::FloatMatrix head_input(std::uint64_t seed, Input input, Eigen::Index row, int head,
                                  Eigen::Index T, int d) {
  return random_floats(T, d, 1, input_seed(seed, input, row * 64 + head));
}

std::vector<double> sinks_of(std::uint64_t seed, const Params& a) {
  std::vector<double> sinks;
  for (int h = 0; a.sinks != 0 && h < a.key_heads * a.group; ++h)
    sinks.push_back(static_cast<double>(static_cast<int>((seed >> (3 * h)) % 41) - 20) / 10.0);
  return sinks;
}

// [rows, L, heads, D] at the rank's positions.
at::Tensor local_heads(std::uint64_t seed, Input input, int64_t rows, int heads, Eigen::Index T,
                       int d, const at::Tensor& positions) {
  std::vector<at::Tensor> per_row;
  for (int64_t b = 0; b < rows; ++b) {
    std::vector<at::Tensor> all;
    for (int h = 0; h < heads; ++h) all.push_back(to_tensor(head_input(seed, input, b, h, T, d)));
    per_row.push_back(at::stack(all, 1).index_select(0, positions));
  }
  return at::stack(per_row);
}

Sharder shard_of(const PackedCase& c, const MeshPtr& mesh) {
  return prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, 1, true, pad_of(options_of(c)));
}

Sharder shard_of(const BshdCase& c, const MeshPtr& mesh) {
  return prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                           pad_of(options_of(c)));
}

reference::Sharder reference_shard(const PackedCase& c) {
  return reference::prepare_packed_cp_inputs(make_batch(c), options_of(c));
}

reference::Sharder reference_shard(const BshdCase& c) {
  return reference::prepare_cp_inputs(make_batch(c), options_of(c));
}

// Microbatch 0 of a case through cp_attention on this rank.
template <class Case>
std::string attend(const std::string& p, const MeshPtr& mesh) {
  const auto [text, c] = decode_with<Case, std::string>(p);
  const Params a = decode_params(text);
  const Sharder s = shard_of(c, mesh);
  const LocalShard shard = s.local(0);
  const auto T = static_cast<Eigen::Index>(shard.layout.padded_len);
  const int64_t rows = shard.labels.size(0);
  const at::Tensor positions = layout_positions_of(shard.layout);
  const int hq = a.key_heads * a.group;
  auto heads = [&](Input input, int count) {
    return local_heads(c.seed, input, rows, count, T, a.head_dim, positions);
  };
  const at::Tensor q = heads(Input::kQuery, hq).requires_grad_(true);
  const at::Tensor k = heads(Input::kKey, a.key_heads).requires_grad_(true);
  const at::Tensor v = heads(Input::kValue, a.key_heads).requires_grad_(true);
  const at::Tensor d_out = heads(Input::kAttentionGrad, hq);
  CpAttentionOptions options{a.scale_tenths / 10.0, a.softcap_tenths / 10.0, at::Tensor()};
  const std::vector<double> sinks = sinks_of(c.seed, a);
  if (!sinks.empty()) options.sinks = at::tensor(sinks, at::kFloat).requires_grad_(true);
  const auto plan = std::make_shared<const AttentionPlan>(
      attention_plan(s, 0, cp_rank(mesh), static_cast<int64_t>(a.window)));
  const CpAttentionOutput out = cp_attention(q, k, v, plan, mesh, options);
  std::vector<at::Tensor> inputs{q, k, v};
  if (options.sinks.defined()) inputs.push_back(options.sinks);
  const auto grads = torch::autograd::grad({out.out}, inputs, {d_out});
  pool::Bundle reply;
  reply.add("out", out.out.detach());
  reply.add("lse", out.lse);
  reply.add("dq", grads[0]);
  reply.add("dk", grads[1]);
  reply.add("dv", grads[2]);
  reply.add("dsinks", options.sinks.defined() ? grads[3] : at::empty({0}));
  reply.add("bytes", at::tensor({cp_attention_received_bytes(*plan, a.key_heads, a.head_dim, 4)}));
  return reply.serialise();
}

const RankTask attention_packed("cp_attention_packed",
                                [](const std::string& p, const MeshPtr& mesh, int) {
                                  return attend<PackedCase>(p, mesh);
                                });
const RankTask attention_bshd("cp_attention_bshd", [](const std::string& p, const MeshPtr& mesh,
                                                      int) { return attend<BshdCase>(p, mesh); });

Params gen_params() {
  Params a;
  a.key_heads = *rc::gen::inRange(1, 3);
  a.group = *rc::gen::inRange(1, 3);
  a.head_dim = *rc::gen::inRange(1, 6);
  a.window = *rc::gen::element(0, 0, 1, 3, 8);
  a.softcap_tenths = *rc::gen::element(0, 0, 20);
  a.sinks = *rc::gen::element(0, 1);
  a.scale_tenths = *rc::gen::element(0, 0, 3);
  return a;
}

// The reference's attention of microbatch 0, row by row, against every rank's reply.
template <class Case>
void check_attention(const Case& c, const Params& a, const RankTask& task) {
  const auto bundles = task.run(c.cp, encode_with(encode_params(a), c));
  const reference::Sharder s = reference_shard(c);
  const auto T = static_cast<Eigen::Index>(s.global(0).padded_len);
  const int hq = a.key_heads * a.group;
  reference::AttentionOptions options;
  options.window = a.window;
  options.softcap = a.softcap_tenths / 10.0;
  options.scale = a.scale_tenths / 10.0;
  options.sinks = sinks_of(c.seed, a);
  std::vector<reference::LocalShard> shards;
  for (int r = 0; r < c.cp; ++r) shards.push_back(s.local(0, r));
  const Eigen::Index rows = shards[0].labels.rows();
  std::vector<int64_t> keys(static_cast<std::size_t>(c.cp), 0);
  std::vector<std::vector<double>> dsinks(static_cast<std::size_t>(c.cp),
                                          std::vector<double>(options.sinks.size(), 0.0));
  for (Eigen::Index row = 0; row < rows; ++row) {
    std::vector<reference::RankHeads> ranks;
    std::vector<std::vector<reference::FloatMatrix>> d_out;
    std::vector<reference::TokenMeta> metas;
    for (const reference::LocalShard& l : shards) {
      auto cut = [&](Input input, int count) {
        std::vector<reference::FloatMatrix> out;
        for (int h = 0; h < count; ++h) {
          const reference::FloatMatrix all = head_input(c.seed, input, row, h, T, a.head_dim);
          reference::FloatMatrix mine(static_cast<Eigen::Index>(l.layout.positions.size()),
                                      a.head_dim);
          for (std::size_t i = 0; i < l.layout.positions.size(); ++i)
            mine.row(static_cast<Eigen::Index>(i)) =
                all.row(static_cast<Eigen::Index>(l.layout.positions[i]));
          out.push_back(mine);
        }
        return out;
      };
      metas.push_back({l.position_ids.row(row).transpose(), l.document_ids.row(row).transpose(),
                       l.padding.row(row).transpose()});
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
      const std::string on = " on rank " + std::to_string(r) + ", row " + std::to_string(row);
      auto mine = [&](const char* name) { return b.get(name)[row]; };
      require_near(mine("out"), stacked(out[r].out), kAttentionAtol, kAttentionRtol, "output" + on);
      std::vector<at::Tensor> lse;
      for (const auto& l : out[r].lse)
        lse.push_back(
            at::tensor(std::vector<double>(l.data(), l.data() + l.size())).to(at::kFloat));
      require_near(mine("lse"), at::stack(lse), kAttentionAtol, kAttentionRtol, "lse" + on);
      require_near(mine("dq"), stacked(grads[r].dq), kAttentionAtol, kAttentionRtol, "dq" + on);
      require_near(mine("dk"), stacked(grads[r].dk), kAttentionAtol * c.cp * a.group,
                   kAttentionRtol, "dk" + on);
      require_near(mine("dv"), stacked(grads[r].dv), kAttentionAtol * c.cp * a.group,
                   kAttentionRtol, "dv" + on);
      for (int o = 0; o < c.cp; ++o)
        keys[static_cast<std::size_t>(r)] += static_cast<int64_t>(
            needed[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)].size());
    }
    for (int r = 0; r < c.cp; ++r)  // d sinks sums over every row's queries
      for (std::size_t h = 0; h < options.sinks.size(); ++h)
        dsinks[static_cast<std::size_t>(r)][h] += grads[r].dsinks[h];
  }
  for (int r = 0; r < c.cp; ++r) {
    const pool::Bundle& b = bundles[static_cast<std::size_t>(r)];
    RC_ASSERT(b.get("bytes").item<int64_t>() ==
              2 * keys[static_cast<std::size_t>(r)] * a.key_heads * a.head_dim * 4);
    if (!options.sinks.empty())
      require_near(b.get("dsinks"),
                   at::tensor(dsinks[static_cast<std::size_t>(r)], at::kDouble).to(at::kFloat),
                   kAttentionAtol * T * static_cast<double>(rows), kAttentionRtol,
                   "d sinks on rank " + std::to_string(r));
  }
}

RC_GTEST_PROP(OptimizedCpAttention, PackedEqualsReference, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  c.layout = *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_packed_layout());
  check_attention(c, gen_params(), attention_packed);
}

RC_GTEST_PROP(OptimizedCpAttention, BshdEqualsReference, ()) {
  BshdCase c = *gen_bshd_case();
  c.layout = *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_bshd_layout());
  check_attention(c, gen_params(), attention_bshd);
}

}  // namespace
}  // namespace cpkit::harness
