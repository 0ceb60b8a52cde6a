// docs/spec.md section 3 (the attention mask) for the reference: CP attention (local queries,
// gathered keys/values, the SPEC 3 mask) equals single-device masked attention in output and in dQ,
// dK, dV.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

// Both sides compute in double from the same float inputs and round once to float; only the
// order of the double sums differs, so float rounding bounds the difference.
constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;

TokenMeta meta_of(const IntMatrix& pos, const IntMatrix& doc, const BoolMatrix& pad) {
  return {pos.row(0).transpose(), doc.row(0).transpose(), pad.row(0).transpose()};
}

RC_GTEST_PROP(ReferenceAttention, CpAttentionEqualsSingleDevice, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  const int head = *rc::gen::inRange(1, 5);
  const Sharder s = prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const GlobalStreams& g = s.global(0);
  const auto T = g.padded_len;
  const FloatMatrix q = random_floats(T, head, 1, input_seed(c.seed, Input::kQuery));
  const FloatMatrix k = random_floats(T, head, 1, input_seed(c.seed, Input::kKey));
  const FloatMatrix v = random_floats(T, head, 1, input_seed(c.seed, Input::kValue));
  const FloatMatrix d_out = random_floats(T, head, 1, input_seed(c.seed, Input::kAttentionGrad));
  const TokenMeta meta = meta_of(g.position_ids, g.document_ids, g.padding);

  const FloatMatrix out = masked_attention(q, k, v, meta, meta);
  const AttentionGrads grads = masked_attention_backward(q, k, v, meta, meta, d_out);

  std::vector<RankAttention> ranks;
  std::vector<FloatMatrix> d_out_local;
  for (int r = 0; r < c.cp; ++r) {
    const LocalShard l = s.local(0, r);
    const auto b = l.layout.begin, n = l.layout.local_len;
    ranks.push_back({q.middleRows(b, n), k.middleRows(b, n), v.middleRows(b, n),
                     meta_of(l.position_ids, l.document_ids, l.padding)});
    d_out_local.push_back(d_out.middleRows(b, n));
  }
  const auto cp_out = cp_attention(ranks);
  const auto cp_grads = cp_attention_backward(ranks, d_out_local);
  for (int r = 0; r < c.cp; ++r) {
    const auto b = s.layout(0, r).begin, n = s.layout(0, r).local_len;
    const auto rank = " on rank " + std::to_string(r);
    const std::string e_o = mismatch(cp_out[r], out.middleRows(b, n), kAtol, kRtol);
    const std::string e_q = mismatch(cp_grads[r].dq, grads.dq.middleRows(b, n), kAtol, kRtol);
    const std::string e_k = mismatch(cp_grads[r].dk, grads.dk.middleRows(b, n), kAtol, kRtol);
    const std::string e_v = mismatch(cp_grads[r].dv, grads.dv.middleRows(b, n), kAtol, kRtol);
    if (!e_o.empty()) RC_FAIL("output " + e_o + rank);
    if (!e_q.empty()) RC_FAIL("dQ " + e_q + rank);
    if (!e_k.empty()) RC_FAIL("dK " + e_k + rank);
    if (!e_v.empty()) RC_FAIL("dV " + e_v + rank);
  }
}

// The backward formulas themselves, against central differences of <d_out, O>.
RC_GTEST_PROP(ReferenceAttention, BackwardMatchesFiniteDifferences, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  c.cp = 1;
  const Sharder s = prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const GlobalStreams& g = s.global(0);
  const auto T = g.padded_len;
  const int head = 2;
  FloatMatrix q = random_floats(T, head, 1, input_seed(c.seed, Input::kQuery));
  FloatMatrix k = random_floats(T, head, 1, input_seed(c.seed, Input::kKey));
  FloatMatrix v = random_floats(T, head, 1, input_seed(c.seed, Input::kValue));
  const FloatMatrix d_out = random_floats(T, head, 1, input_seed(c.seed, Input::kAttentionGrad));
  const TokenMeta meta = meta_of(g.position_ids, g.document_ids, g.padding);
  const AttentionGrads grads = masked_attention_backward(q, k, v, meta, meta, d_out);
  auto objective = [&] {
    return (masked_attention(q, k, v, meta, meta).cast<double>().array() *
            d_out.cast<double>().array())
        .sum();
  };
  const float h = 1e-2f;
  auto check = [&](FloatMatrix& x, const FloatMatrix& dx, const char* name) {
    const auto i = *rc::gen::inRange<Eigen::Index>(0, T);
    const auto j = *rc::gen::inRange<Eigen::Index>(0, head);
    const float saved = x(i, j);
    x(i, j) = saved + h;
    const double up = objective();
    x(i, j) = saved - h;
    const double down = objective();
    x(i, j) = saved;
    const double numeric = (up - down) / (2 * h);
    if (std::abs(numeric - dx(i, j)) > 2e-3 * (1 + std::abs(numeric)))
      RC_FAIL(std::string(name) + " at [" + std::to_string(i) + ", " + std::to_string(j) +
              "]: analytic " + std::to_string(dx(i, j)) + " vs numeric " + std::to_string(numeric));
  };
  check(q, grads.dq, "dQ");
  check(k, grads.dk, "dK");
  check(v, grads.dv, "dV");
}

}  // namespace
}  // namespace cpkit::harness
