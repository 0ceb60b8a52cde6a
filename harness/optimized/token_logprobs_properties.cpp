// SPEC 5b on the optimized path in real rank processes: token_logprobs (per-token
// log-probability and entropy through the fused head) against the reference's full logits,
// values and gradients for random upstreams, BSHD and packed batches, every layout, CP 1-8,
// soft cap and temperature, chunks that do and do not divide the rows.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

// What a token_logprobs case adds to its batch.
struct LogprobParams {
  int hidden = 1;         // H
  double head_scale = 1;  // logits ~ N(0, head_scale^2)
  double softcap = 0;
  double temperature = 1;
  int chunk_rows = 0;  // 0: the default
  bool entropy = true;
};

std::ostream& operator<<(std::ostream& os, const LogprobParams& p) {
  return os << p.hidden << "," << p.head_scale << "," << p.softcap << "," << p.temperature << ","
            << p.chunk_rows << "," << p.entropy;
}

std::istream& operator>>(std::istream& in, LogprobParams& p) {
  std::string text;
  in >> text;
  int entropy = 0;
  std::sscanf(text.c_str(), "%d,%lf,%lf,%lf,%d,%d", &p.hidden, &p.head_scale, &p.softcap,
              &p.temperature, &p.chunk_rows, &entropy);
  p.entropy = entropy != 0;
  return in;
}

// Microbatch m's global hidden states [rows * S_pad, H], N(0, 1).
reference::FloatMatrix global_hidden(const auto& c, const LogprobParams& p, Eigen::Index rows,
                                     Eigen::Index padded_len, int m) {
  return random_floats(rows * padded_len, p.hidden, 1.0f, input_seed(c.seed, Input::kHidden, m));
}

// Its upstream gradients [rows * S_pad, 2]: d/d logprob, d/d entropy, N(0, 1).
reference::FloatMatrix global_upstream(const auto& c, Eigen::Index rows, Eigen::Index padded_len,
                                       int m) {
  return random_floats(rows * padded_len, 2, 1.0f, input_seed(c.seed, Input::kLogprobGrad, m));
}

reference::FloatMatrix head_weight(const auto& c, const LogprobParams& p) {
  return random_floats(c.vocab, p.hidden, static_cast<float>(p.head_scale / std::sqrt(p.hidden)),
                       input_seed(c.seed, Input::kHeadWeight));
}

// This rank's tokens of a global [rows, S_pad, X] tensor, in its layout's order.
at::Tensor mine(const at::Tensor& global, const LocalShard& s) {
  return global.index_select(1, layout_positions_of(s.layout)).contiguous();
}

template <class Case>
std::string logprob_task(const Case& c, const Sharder& sharder, const LogprobParams& p,
                         const MeshPtr& mesh) {
  pool::Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const LocalShard s = sharder.local(m);
    const int64_t rows = s.labels.size(0), S = s.layout.padded_len;
    const at::Tensor hidden =
        mine(to_tensor(global_hidden(c, p, rows, S, m)).view({rows, S, p.hidden}), s)
            .requires_grad_(true);
    const at::Tensor up = mine(to_tensor(global_upstream(c, rows, S, m)).view({rows, S, 2}), s);
    const at::Tensor weight = to_tensor(head_weight(c, p)).requires_grad_(true);
    TokenLogprobsOptions options;
    options.softcap = p.softcap;
    options.temperature = p.temperature;
    options.entropy = p.entropy;
    options.chunk_rows = p.chunk_rows;
    options.layout = s.layout.plan;
    const TokenLogprobs r = token_logprobs(hidden, weight, s.labels, s.valid, mesh, options);
    at::Tensor objective = (r.logprobs * up.select(2, 0)).sum();
    if (p.entropy) objective = objective + (r.entropy * up.select(2, 1)).sum();
    const auto grads = torch::autograd::grad({objective}, {hidden, weight});
    const std::string key = std::to_string(m);
    out.add(key + ".logprobs", r.logprobs.reshape({-1}));
    if (p.entropy) out.add(key + ".entropy", r.entropy.reshape({-1}));
    out.add(key + ".has_target", r.has_target.reshape({-1}).to(at::kFloat));
    out.add(key + ".dhidden", grads[0].reshape({-1, p.hidden}));
    out.add(key + ".dweight", grads[1]);
  }
  return out.serialise();
}

const RankTask logprobs_bshd("token_logprobs_bshd", [](const std::string& text, const MeshPtr& mesh,
                                                       int) {
  const auto [p, c] = decode_with<BshdCase, LogprobParams>(text);
  const Sharder s = prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      pad_of(options_of(c)));
  return logprob_task(c, s, p, mesh);
});

const RankTask logprobs_packed("token_logprobs_packed",
                               [](const std::string& text, const MeshPtr& mesh, int) {
                                 const auto [p, c] = decode_with<PackedCase, LogprobParams>(text);
                                 const Sharder s = prepare_packed_cp_inputs(
                                     to_cp_batch(make_batch(c)), mesh,
                                     static_cast<int>(c.rows.size()), true, pad_of(options_of(c)));
                                 return logprob_task(c, s, p, mesh);
                               });

at::Tensor doubles(const std::vector<double>& v) {
  return at::tensor(at::ArrayRef<double>(v.data(), v.size()), at::kDouble);
}

template <class Case>
void check_logprobs(const Case& c, const reference::Sharder& s, const RankTask& task,
                    const LogprobParams& p) {
  const auto bundles = task.run(c.cp, encode_with(p, c));
  const reference::FloatMatrix weight = head_weight(c, p);
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const reference::GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    const reference::FloatMatrix global = global_hidden(c, p, rows, g.padded_len, m);
    const RankLossInputs in = cut_for_ranks(global, s, m);
    const RankLossInputs up = cut_for_ranks(global_upstream(c, rows, g.padded_len, m), s, m);
    std::vector<std::vector<double>> g_lp, g_ent;
    for (const auto& u : up.values) {
      g_lp.emplace_back();
      g_ent.emplace_back();
      for (Eigen::Index i = 0; i < u.rows(); ++i) {
        g_lp.back().push_back(u(i, 0));
        g_ent.back().push_back(p.entropy ? u(i, 1) : 0.0);  // no entropy: no upstream for it
      }
    }
    const auto ref = reference::token_logprobs(in.values, weight, in.labels, in.valid, g_lp, g_ent,
                                               {p.softcap, p.temperature, reference_layout(s, m)});
    // Float error of one logit (a length-H dot product), then of z - max at the |z| bound
    // and of the fast exponential; a gradient row sums V (d hidden) or the rows (d weight)
    // of per-logit errors scaled by the upstreams (|u| <= 6 for N(0, 1) draws here).
    const double wmax = weight.cwiseAbs().maxCoeff(), hmax = global.cwiseAbs().maxCoeff();
    const double t = p.temperature;
    const double logit_err = 2 * kEps * p.hidden * wmax * hmax / t;
    const double zmax = 6 * p.head_scale / t + std::log(static_cast<double>(c.vocab));
    const double value_err = 4 * logit_err + 16 * kEps * (zmax + 1);
    const double logit_grad_err = 6 * (1 + 2 * zmax) * value_err / t;
    for (int r = 0; r < c.cp; ++r) {
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      const pool::Bundle& b = bundles[r];
      const std::string key = std::to_string(m);
      std::vector<double> has(ref[r].has_target.begin(), ref[r].has_target.end());
      require_near(b.get(key + ".has_target"), doubles(has), 0, 0, "has_target" + where);
      require_near(b.get(key + ".logprobs"), doubles(ref[r].logprobs), value_err, 1e-5,
                   "logprobs" + where);
      if (p.entropy)
        require_near(b.get(key + ".entropy"), doubles(ref[r].entropy), value_err, 1e-5,
                     "entropy" + where);
      require_near(b.get(key + ".dhidden"), to_tensor(ref[r].grad_hidden),
                   logit_grad_err * c.vocab * wmax + 1e-12, 1e-4, "d hidden" + where);
      require_near(b.get(key + ".dweight"), to_tensor(ref[r].grad_weight),
                   logit_grad_err * static_cast<double>(in.values[r].rows()) * hmax + 1e-12, 1e-4,
                   "d weight" + where);
    }
  }
}

rc::Gen<LogprobParams> gen_logprob_params() {
  return rc::gen::exec([] {
    LogprobParams p;
    p.hidden = *rc::gen::element(1, 4, 16, *rc::gen::inRange(1, 49));
    p.head_scale = *rc::gen::element(1.0, 3.0, 30.0);
    p.softcap = *rc::gen::element(0.0, 0.0, 5.0, 30.0);
    p.temperature = *rc::gen::element(1.0, 1.0, 0.6, 1.5);
    p.chunk_rows = *rc::gen::element(0, 1, *rc::gen::inRange(1, 40));
    p.entropy = *rc::gen::element(true, true, false);
    return p;
  });
}

void check_bshd(const BshdCase& c, const LogprobParams& p) {
  check_logprobs(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), logprobs_bshd, p);
}

void check_packed(const PackedCase& c, const LogprobParams& p) {
  check_logprobs(c, reference::prepare_packed_cp_inputs(make_batch(c), options_of(c)),
                 logprobs_packed, p);
}

RC_GTEST_PROP(OptimizedTokenLogprobs, BshdEqualsReference, ()) {
  check_bshd(*gen_bshd_case(), *gen_logprob_params());
}

RC_GTEST_PROP(OptimizedTokenLogprobs, PackedEqualsReference, ()) {
  check_packed(*gen_packed_case(), *gen_logprob_params());
}

// Layouts (SPEC 2b) at CP 2-8: each token's target follows the fragments, as the loss's does.
RC_GTEST_PROP(OptimizedTokenLogprobs, EveryLayoutEqualsReference, ()) {
  BshdCase b = *gen_bshd_case();
  b.layout = *gen_bshd_layout();
  b.cp = *rc::gen::inRange(2, 9);
  check_bshd(b, *gen_logprob_params());
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.cp = *rc::gen::inRange(2, 9);
  check_packed(p, *gen_logprob_params());
}

}  // namespace
}  // namespace cpkit::harness
