// docs/spec.md section 4b for the reference: CP attention over any layout equals attention on
// the unsharded row (output, log-sum-exp, dq, dk, dv on their owners, d sinks summed over the
// ranks) with sliding windows, GQA, sinks and the soft cap; and each rank's attention over its
// own keys plus only the keys needed_keys lists equals its attention over the whole row.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

// Both sides compute in double from the same float inputs and round once to float.
constexpr double kTol = 1e-5;

struct AttentionCase {
  PackedCase packed;
  int key_heads = 1, group = 1, head_dim = 1;
  AttentionOptions options;
};

rc::Gen<AttentionCase> gen_attention_case() {
  return rc::gen::exec([] {
    AttentionCase a;
    a.packed = *gen_packed_case();
    a.packed.rows.resize(1);
    a.packed.layout =
        *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_packed_layout());
    a.key_heads = *rc::gen::inRange(1, 3);
    a.group = *rc::gen::inRange(1, 3);
    a.head_dim = *rc::gen::inRange(1, 5);
    a.options.window = *rc::gen::element<std::int64_t>(0, 0, 1, 3, 8);
    a.options.softcap = *rc::gen::element(0.0, 0.0, 2.0);
    a.options.scale = *rc::gen::element(0.0, 0.0, 0.3);
    if (*rc::gen::arbitrary<bool>())
      for (int h = 0; h < a.key_heads * a.group; ++h)
        a.options.sinks.push_back(*rc::gen::inRange(-20, 21) / 10.0);
    return a;
  });
}

TokenMeta meta_at(const GlobalStreams& g, const std::vector<std::int64_t>& positions) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  TokenMeta m{IntVector(n), IntVector(n), BoolVector(n)};
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto p = static_cast<Eigen::Index>(positions[static_cast<std::size_t>(i)]);
    m.position(i) = g.position_ids(0, p);
    m.document(i) = g.document_ids(0, p);
    m.padding(i) = g.padding(0, p);
  }
  return m;
}

FloatMatrix rows_at(const FloatMatrix& m, const std::vector<std::int64_t>& positions) {
  FloatMatrix out(static_cast<Eigen::Index>(positions.size()), m.cols());
  for (std::size_t i = 0; i < positions.size(); ++i)
    out.row(static_cast<Eigen::Index>(i)) = m.row(static_cast<Eigen::Index>(positions[i]));
  return out;
}

std::vector<FloatMatrix> heads(int count, Eigen::Index rows, int dim, Input input,
                               std::uint64_t seed) {
  std::vector<FloatMatrix> out;
  for (int h = 0; h < count; ++h)
    out.push_back(random_floats(rows, dim, 1, input_seed(seed, input, h)));
  return out;
}

RankHeads cut(const RankHeads& whole, const GlobalStreams& g,
              const std::vector<std::int64_t>& positions) {
  RankHeads r{{}, {}, {}, meta_at(g, positions)};
  for (const FloatMatrix& m : whole.q) r.q.push_back(rows_at(m, positions));
  for (const FloatMatrix& m : whole.k) r.k.push_back(rows_at(m, positions));
  for (const FloatMatrix& m : whole.v) r.v.push_back(rows_at(m, positions));
  return r;
}

void require_close(const FloatMatrix& got, const FloatMatrix& want, const std::string& what) {
  const std::string e = mismatch(got, want, kTol, kTol);
  if (!e.empty()) RC_FAIL(what + ": " + e);
}

RC_GTEST_PROP(ReferenceCpAttention, EveryLayoutEqualsTheUnshardedRow, ()) {
  const AttentionCase a = *gen_attention_case();
  const PackedCase& c = a.packed;
  const Sharder s = prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const GlobalStreams& g = s.global(0);
  std::vector<std::int64_t> all(static_cast<std::size_t>(g.padded_len));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  const int hq = a.key_heads * a.group;
  const RankHeads whole{heads(hq, g.padded_len, a.head_dim, Input::kQuery, c.seed),
                        heads(a.key_heads, g.padded_len, a.head_dim, Input::kKey, c.seed),
                        heads(a.key_heads, g.padded_len, a.head_dim, Input::kValue, c.seed),
                        meta_at(g, all)};
  const std::vector<FloatMatrix> d_whole =
      heads(hq, g.padded_len, a.head_dim, Input::kAttentionGrad, c.seed);
  const HeadsOutput one = cp_attention({whole}, a.options)[0];
  const HeadsGrads one_grads = cp_attention_backward({whole}, {d_whole}, a.options)[0];

  std::vector<RankHeads> ranks;
  std::vector<std::vector<FloatMatrix>> d_out;
  for (int r = 0; r < c.cp; ++r) {
    const std::vector<std::int64_t>& p = s.local(0, r).layout.positions;
    ranks.push_back(cut(whole, g, p));
    d_out.emplace_back();
    for (const FloatMatrix& m : d_whole) d_out.back().push_back(rows_at(m, p));
  }
  const auto out = cp_attention(ranks, a.options);
  const auto grads = cp_attention_backward(ranks, d_out, a.options);
  std::vector<double> dsinks(a.options.sinks.size(), 0.0);
  for (int r = 0; r < c.cp; ++r) {
    const std::vector<std::int64_t>& p = s.local(0, r).layout.positions;
    const std::string at = " on rank " + std::to_string(r);
    for (int h = 0; h < hq; ++h) {
      const std::string head = " of head " + std::to_string(h) + at;
      require_close(out[r].out[h], rows_at(one.out[h], p), "output" + head);
      require_close(grads[r].dq[h], rows_at(one_grads.dq[h], p), "dq" + head);
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double got = out[r].lse[h](static_cast<Eigen::Index>(i));
        const double want = one.lse[h](static_cast<Eigen::Index>(p[i]));
        const bool close =
            std::isinf(want) ? got == want : std::abs(got - want) <= kTol * (1 + std::abs(want));
        if (!close)
          RC_FAIL("lse" + head + ": " + std::to_string(got) + " vs " + std::to_string(want));
      }
    }
    for (int h = 0; h < a.key_heads; ++h) {
      require_close(grads[r].dk[h], rows_at(one_grads.dk[h], p), "dk" + at);
      require_close(grads[r].dv[h], rows_at(one_grads.dv[h], p), "dv" + at);
    }
    for (std::size_t h = 0; h < dsinks.size(); ++h) dsinks[h] += grads[r].dsinks[h];
  }
  for (std::size_t h = 0; h < dsinks.size(); ++h)
    RC_ASSERT(std::abs(dsinks[h] - one_grads.dsinks[h]) <=
              kTol * (1 + std::abs(one_grads.dsinks[h])));

  // Sufficiency of the needed keys: rank r's queries over its own keys and, from every other
  // rank o, only needed[r][o], give rank r's output over the whole row.
  std::vector<TokenMeta> metas;
  for (const RankHeads& r : ranks) metas.push_back(r.meta);
  const NeededKeys needed = needed_keys(metas, a.options.window);
  for (int r = 0; r < c.cp; ++r) {
    std::vector<RankHeads> mine{ranks[static_cast<std::size_t>(r)]};
    for (int o = 0; o < c.cp; ++o) {
      const auto& list = needed[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)];
      if (o == r) {
        RC_ASSERT(list.empty());
        continue;
      }
      const std::vector<std::int64_t> keep(list.begin(), list.end());
      const RankHeads& owner = ranks[static_cast<std::size_t>(o)];
      RankHeads part{{}, {}, {}, TokenMeta{}};
      const std::vector<std::int64_t>& p = s.local(0, o).layout.positions;
      std::vector<std::int64_t> global;
      for (const std::int64_t j : keep) global.push_back(p[static_cast<std::size_t>(j)]);
      part.meta = meta_at(g, global);
      for (const FloatMatrix& m : owner.q) part.q.push_back(rows_at(m, keep));
      for (const FloatMatrix& m : owner.k) part.k.push_back(rows_at(m, keep));
      for (const FloatMatrix& m : owner.v) part.v.push_back(rows_at(m, keep));
      mine.push_back(part);
    }
    const HeadsOutput partial = cp_attention(mine, a.options)[0];
    for (int h = 0; h < hq; ++h)
      require_close(partial.out[h], out[r].out[h],
                    "output over the needed keys of head " + std::to_string(h) + " on rank " +
                        std::to_string(r));
  }
}

// One head over a whole packed row (CP 1): q, k, v, an output gradient and the metadata.
struct OneHeadRow {
  FloatMatrix q, k, v, d_out;
  TokenMeta meta;
};

OneHeadRow gen_one_head_row() {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  const int d = *rc::gen::inRange(1, 5);
  const Sharder s = prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const GlobalStreams& g = s.global(0);
  auto input = [&](Input which) {
    return random_floats(g.padded_len, d, 1, input_seed(c.seed, which));
  };
  return {input(Input::kQuery),
          input(Input::kKey),
          input(Input::kValue),
          input(Input::kAttentionGrad),
          {g.position_ids.row(0).transpose(), g.document_ids.row(0).transpose(),
           g.padding.row(0).transpose()}};
}

// Independent truths for the oracle itself. Without options and with one head it is the
// masked attention of section 3 (attention.hpp, written separately).
RC_GTEST_PROP(ReferenceCpAttention, WithoutOptionsIsMaskedAttention, ()) {
  const auto [q, k, v, d_o, meta] = gen_one_head_row();
  const RankHeads whole{{q}, {k}, {v}, meta};
  const HeadsGrads grads = cp_attention_backward({whole}, {{d_o}}, {})[0];
  const AttentionGrads want = masked_attention_backward(q, k, v, meta, meta, d_o);
  require_close(cp_attention({whole}, {})[0].out[0], masked_attention(q, k, v, meta, meta), "out");
  require_close(grads.dq[0], want.dq, "dq");
  require_close(grads.dk[0], want.dk, "dk");
  require_close(grads.dv[0], want.dv, "dv");
}

// A window of 1 lets each query see itself alone: its output is its own value and its
// log-sum-exp its own score (no sink), whatever else the row holds.
RC_GTEST_PROP(ReferenceCpAttention, WindowOfOneSeesItselfAlone, ()) {
  const auto [q, k, v, d_o, meta] = gen_one_head_row();
  const Eigen::Index d = q.cols();
  AttentionOptions window_one;
  window_one.window = 1;
  const HeadsOutput out = cp_attention({RankHeads{{q}, {k}, {v}, meta}}, window_one)[0];
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    if (meta.document(i) == 0 || meta.padding(i)) continue;  // sees nothing (or is padding)
    const double score =
        q.row(i).cast<double>().dot(k.row(i).cast<double>()) / std::sqrt(static_cast<double>(d));
    RC_ASSERT(std::abs(out.lse[0](i) - score) <= kTol * (1 + std::abs(score)));
    for (Eigen::Index j = 0; j < d; ++j) RC_ASSERT(std::abs(out.out[0](i, j) - v(i, j)) <= kTol);
  }
}

// The backward against central finite differences of sum(out * d_out) along a random
// direction in q, k, v and the sinks (small rows; every option drawn).
RC_GTEST_PROP(ReferenceCpAttention, GradientsMatchFiniteDifferences, ()) {
  AttentionCase a = *gen_attention_case();
  a.packed.cp = 1;
  for (auto& row : a.packed.rows)
    for (Doc& doc : row) doc.length = std::min(doc.length, 6);
  const Sharder s = prepare_packed_cp_inputs(make_batch(a.packed), options_of(a.packed));
  const GlobalStreams& g = s.global(0);
  RC_PRE(g.padded_len <= 40);
  const int hq = a.key_heads * a.group;
  const std::uint64_t seed = a.packed.seed;
  const TokenMeta meta{g.position_ids.row(0).transpose(), g.document_ids.row(0).transpose(),
                       g.padding.row(0).transpose()};
  const RankHeads x{heads(hq, g.padded_len, a.head_dim, Input::kQuery, seed),
                    heads(a.key_heads, g.padded_len, a.head_dim, Input::kKey, seed),
                    heads(a.key_heads, g.padded_len, a.head_dim, Input::kValue, seed), meta};
  const RankHeads dir{heads(hq, g.padded_len, a.head_dim, Input::kQuery, seed + 1),
                      heads(a.key_heads, g.padded_len, a.head_dim, Input::kKey, seed + 1),
                      heads(a.key_heads, g.padded_len, a.head_dim, Input::kValue, seed + 1), meta};
  const std::vector<FloatMatrix> d_out =
      heads(hq, g.padded_len, a.head_dim, Input::kAttentionGrad, seed);
  const double eps = 1e-2;
  auto f = [&](double t) {
    RankHeads y = x;
    AttentionOptions o = a.options;
    for (std::size_t h = 0; h < y.q.size(); ++h) y.q[h] += static_cast<float>(t) * dir.q[h];
    for (std::size_t h = 0; h < y.k.size(); ++h) y.k[h] += static_cast<float>(t) * dir.k[h];
    for (std::size_t h = 0; h < y.v.size(); ++h) y.v[h] += static_cast<float>(t) * dir.v[h];
    for (std::size_t h = 0; h < o.sinks.size(); ++h) o.sinks[h] += t * (0.5 - 0.25 * h);
    double total = 0;
    const HeadsOutput out = cp_attention({y}, o)[0];
    for (int h = 0; h < hq; ++h)
      total += (out.out[h].cast<double>().array() * d_out[h].cast<double>().array()).sum();
    return total;
  };
  const double numeric = (f(eps) - f(-eps)) / (2 * eps);
  const HeadsGrads grads = cp_attention_backward({x}, {d_out}, a.options)[0];
  double analytic = 0;
  for (int h = 0; h < hq; ++h)
    analytic += (grads.dq[h].cast<double>().array() * dir.q[h].cast<double>().array()).sum();
  for (int h = 0; h < a.key_heads; ++h) {
    analytic += (grads.dk[h].cast<double>().array() * dir.k[h].cast<double>().array()).sum();
    analytic += (grads.dv[h].cast<double>().array() * dir.v[h].cast<double>().array()).sum();
  }
  for (std::size_t h = 0; h < grads.dsinks.size(); ++h)
    analytic += grads.dsinks[h] * (0.5 - 0.25 * h);
  if (std::abs(numeric - analytic) > 2e-3 * (1 + std::abs(analytic)))
    RC_FAIL("directional derivative " + std::to_string(analytic) + " vs finite differences " +
            std::to_string(numeric));
}

}  // namespace
}  // namespace cpkit::harness
