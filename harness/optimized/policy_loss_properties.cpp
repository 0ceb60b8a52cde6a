// SPEC 5c on the optimized path in real rank processes: policy_loss against the reference's
// full logits, for every kind, aggregation and KL estimator, truncated importance sampling,
// the entropy bonus and the dual clip, BSHD and packed batches (sequences cut across ranks),
// every layout, CP 1-8, float32 and bfloat16 heads (logits_precision fp32): the loss, the
// per-position values and both gradients. A case whose
// ratio lies within 1e-3 of a clip bound is discarded (float32 and double may pick different
// sides of the kink there). The loss and the gradients are sums whose terms may cancel, so
// their tolerances come from float error bounds on the terms (the reference's per-position
// d J / d lp and d J / d entropy), not from the result's own size, with a floor for the
// error of d J / d lp itself.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/policy_loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

const char* const kKinds[] = {"ppo", "cispo", "gspo"};
const char* const kKl[] = {"k1", "k2", "k3"};
const char* const kAggregations[] = {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                     "constant"};

struct PolicyParams {
  int hidden = 1;  // H
  int kind = 0, kl = 2, aggregation = 0;
  double kl_coef = 0, tis_cap = 0, entropy_coef = 0, dual_clip = 0, eps_high = 0.2;
  int chunk_rows = 0;
  int bf16 = 0;     // 1: hidden and the head in bfloat16 (the reference reads the same values)
  int entropy = 0;  // 1: the entropy asked for (else returned only when entropy_coef != 0)
};

std::ostream& operator<<(std::ostream& os, const PolicyParams& p) {
  return os << p.hidden << "," << p.kind << "," << p.kl << "," << p.aggregation << "," << p.kl_coef
            << "," << p.tis_cap << "," << p.entropy_coef << "," << p.dual_clip << "," << p.eps_high
            << "," << p.chunk_rows << "," << p.bf16 << "," << p.entropy;
}

std::istream& operator>>(std::istream& in, PolicyParams& p) {
  std::string text;
  in >> text;
  std::sscanf(text.c_str(), "%d,%d,%d,%d,%lf,%lf,%lf,%lf,%lf,%d,%d,%d", &p.hidden, &p.kind, &p.kl,
              &p.aggregation, &p.kl_coef, &p.tis_cap, &p.entropy_coef, &p.dual_clip, &p.eps_high,
              &p.chunk_rows, &p.bf16, &p.entropy);
  return in;
}

constexpr double kDivisor = 17.0;

// Rounded to bfloat16 when the case asks (every bf16 value is a float: both sides read them).
reference::FloatMatrix in_precision(reference::FloatMatrix x, const PolicyParams& p) {
  if (p.bf16)
    for (Eigen::Index i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(c10::BFloat16(x.data()[i]));
  return x;
}

reference::FloatMatrix global_hidden(const auto& c, const PolicyParams& p, Eigen::Index rows,
                                     Eigen::Index padded_len, int m) {
  return in_precision(
      random_floats(rows * padded_len, p.hidden, 1.0f, input_seed(c.seed, Input::kHidden, m)), p);
}

reference::FloatMatrix head_weight(const auto& c, const PolicyParams& p) {
  return in_precision(
      random_floats(c.vocab, p.hidden, static_cast<float>(2.0 / std::sqrt(p.hidden)),
                    input_seed(c.seed, Input::kHeadWeight)),
      p);
}

// [rows * S_pad, 4]: advantages N(0, 1), then old, reference and sampler log-probabilities
// around log(1 / V) (so ratios spread around 1 and reach both clip bounds).
reference::FloatMatrix global_inputs(const auto& c, Eigen::Index rows, Eigen::Index padded_len,
                                     int m) {
  reference::FloatMatrix x =
      random_floats(rows * padded_len, 4, 1.0f, input_seed(c.seed, Input::kPolicy, m));
  const float base = -std::log(static_cast<float>(c.vocab));
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index k = 1; k < 4; ++k) x(i, k) = base + 0.7f * x(i, k);
  return x;
}

PolicyLossOptions options_of(const PolicyParams& p) {
  PolicyLossOptions o;
  o.kind = parse_policy_kind(kKinds[p.kind]);
  o.kl = parse_kl_estimator(kKl[p.kl]);
  o.aggregation = parse_policy_aggregation(kAggregations[p.aggregation]);
  o.kl_coef = p.kl_coef;
  o.tis_cap = p.tis_cap;
  o.entropy_coef = p.entropy_coef;
  o.entropy = p.entropy != 0;
  o.dual_clip = p.dual_clip;
  o.eps_high = p.eps_high;
  o.divisor = kDivisor;
  o.chunk_rows = p.chunk_rows;
  return o;
}

at::Tensor mine(const at::Tensor& global, const LocalShard& s) {
  return global.index_select(1, layout_positions_of(s.layout)).contiguous();
}

template <class Case>
std::string policy_task(const Case& c, const Sharder& sharder, const PolicyParams& p,
                        const MeshPtr& mesh) {
  pool::Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const LocalShard s = sharder.local(m);
    const int64_t rows = s.labels.size(0), S = s.layout.padded_len;
    const auto dtype = p.bf16 ? at::kBFloat16 : at::kFloat;
    const at::Tensor hidden =
        mine(to_tensor(global_hidden(c, p, rows, S, m)).view({rows, S, p.hidden}), s)
            .to(dtype)
            .requires_grad_(true);
    const at::Tensor x = mine(to_tensor(global_inputs(c, rows, S, m)).view({rows, S, 4}), s);
    const at::Tensor weight = to_tensor(head_weight(c, p)).to(dtype).requires_grad_(true);
    PolicyLossOptions options = options_of(p);
    options.layout = s.layout.plan;
    const PolicyLossInputs inputs{x.select(2, 0), x.select(2, 1), x.select(2, 2), x.select(2, 3),
                                  s.document_ids};
    const PolicyLoss r = policy_loss(hidden, weight, s.labels, s.valid, mesh, inputs, options);
    const auto grads = torch::autograd::grad({r.loss}, {hidden, weight});
    const std::string key = std::to_string(m);
    out.add(key + ".loss", r.loss.reshape({1}));
    out.add(key + ".logprobs", r.logprobs.reshape({-1}));
    out.add(key + ".ratio", r.ratio.reshape({-1}));
    out.add(key + ".clipped", r.clipped.reshape({-1}));
    out.add(key + ".kl", r.kl.reshape({-1}));
    out.add(key + ".entropy", r.entropy.reshape({-1}));
    out.add(key + ".dhidden", grads[0].reshape({-1, p.hidden}).to(at::kFloat));
    out.add(key + ".dweight", grads[1].to(at::kFloat));
  }
  return out.serialise();
}

const RankTask policy_bshd("policy_loss_bshd", [](const std::string& text, const MeshPtr& mesh,
                                                  int) {
  const auto [p, c] = decode_with<BshdCase, PolicyParams>(text);
  const Sharder s = prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      pad_of(harness::options_of(c)));
  return policy_task(c, s, p, mesh);
});

const RankTask policy_packed("policy_loss_packed", [](const std::string& text, const MeshPtr& mesh,
                                                      int) {
  const auto [p, c] = decode_with<PackedCase, PolicyParams>(text);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, static_cast<int>(c.rows.size()),
                               true, pad_of(harness::options_of(c)));
  return policy_task(c, s, p, mesh);
});

at::Tensor doubles(const std::vector<double>& v) {
  return at::tensor(at::ArrayRef<double>(v.data(), v.size()), at::kDouble);
}

// Whether a counted position's ratio (or dual-clip choice) is within 1e-3 of a kink.
bool near_a_kink(const reference::RankPolicyLoss& r, const std::vector<double>& advantages,
                 const reference::PolicyLossOptions& o) {
  for (std::size_t i = 0; i < r.ratio.size(); ++i) {
    const double q = r.ratio[i];
    if (q == 0) continue;
    for (const double bound : {1.0 - o.eps_low, 1.0 + o.eps_high})
      if (std::abs(q - bound) < 1e-3) return true;
    if (o.dual_clip > 1 && advantages[i] < 0 &&
        std::abs(o.dual_clip - std::max(q, std::clamp(q, 1.0 - o.eps_low, 1.0 + o.eps_high))) <
            1e-3)
      return true;
  }
  return false;
}

// What float32 may err by on one rank's loss and gradients, from each position's float error
// bound: its logits (an H-long dot product) and log-sum-exp at its |z| bound, times |d J / d lp|
// and |d J / d entropy| (the entropy's chain rule multiplies by up to 2 |z|). A d hidden row
// sums V such terms times |w| <= wmax, d weight sums rows times |h|: each GEMM's float sum
// adds up to (terms) * eps of its absolute sum, and |dz| sums to at most 2 |g| over a row.
struct ErrorBounds {
  double loss = 0, dweight = 0;
  std::vector<double> dhidden;  // per row
};

ErrorBounds error_bounds(const reference::FloatMatrix& hidden, const reference::FloatMatrix& weight,
                         const reference::RankPolicyLoss& want) {
  const double wmax = weight.cwiseAbs().maxCoeff();
  const auto V = static_cast<double>(weight.rows()), rows = static_cast<double>(hidden.rows());
  const double log_v = std::log(V);
  ErrorBounds e;
  for (Eigen::Index i = 0; i < hidden.rows(); ++i) {
    const double hsum = hidden.row(i).cwiseAbs().cast<double>().sum();
    const double zmax = hsum * wmax;
    const double lp_err =
        2 * (static_cast<double>(hidden.cols()) + 1) * kEps * zmax + 4 * kEps * (zmax + log_v);
    const auto k = static_cast<std::size_t>(i);
    const double g =
        std::abs(want.grad_logprobs[k]) + 2 * (zmax + log_v) * std::abs(want.grad_entropy[k]);
    e.loss += (std::abs(want.grad_logprobs[k]) + std::abs(want.grad_entropy[k])) * lp_err;
    e.dhidden.push_back(g * wmax * (lp_err + 2 * V * kEps));
    e.dweight += g * hidden.row(i).cwiseAbs().maxCoeff() * (lp_err + 2 * rows * kEps);
  }
  return e;
}

template <class Case>
void check_policy(const Case& c, const reference::Sharder& s, const RankTask& task,
                  const PolicyParams& p) {
  reference::PolicyLossOptions ro;
  ro.kind = kKinds[p.kind];
  ro.kl = kKl[p.kl];
  ro.aggregation = kAggregations[p.aggregation];
  ro.kl_coef = p.kl_coef;
  ro.tis_cap = p.tis_cap;
  ro.entropy_coef = p.entropy_coef;
  ro.dual_clip = p.dual_clip;
  ro.eps_high = p.eps_high;
  ro.divisor = kDivisor;
  ro.cp = c.cp;
  const reference::FloatMatrix weight = head_weight(c, p);
  std::vector<std::vector<reference::RankPolicyLoss>> refs;
  std::vector<std::vector<ErrorBounds>> bounds;
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const reference::GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    const RankLossInputs in = cut_for_ranks(global_hidden(c, p, rows, g.padded_len, m), s, m);
    const RankLossInputs x = cut_for_ranks(global_inputs(c, rows, g.padded_len, m), s, m);
    std::vector<reference::PolicyRankInputs> ranks;
    for (int r = 0; r < c.cp; ++r) {
      reference::PolicyRankInputs ri{in.values[r], in.labels[r], in.valid[r], {}, {}, {}, {}, {}};
      for (Eigen::Index i = 0; i < x.values[r].rows(); ++i) {
        ri.advantages.push_back(x.values[r](i, 0));
        ri.old_logprobs.push_back(x.values[r](i, 1));
        ri.ref_logprobs.push_back(x.values[r](i, 2));
        ri.sampler_logprobs.push_back(x.values[r](i, 3));
      }
      const reference::IntMatrix& ids = s.local(m, r).document_ids;
      for (Eigen::Index b = 0; b < ids.rows(); ++b)
        for (Eigen::Index j = 0; j < ids.cols(); ++j) ri.sequence_ids.push_back(ids(b, j));
      ranks.push_back(ri);
    }
    ro.layout = reference_layout(s, m);
    refs.push_back(reference::policy_loss(ranks, weight, ro));
    bounds.emplace_back();
    for (int r = 0; r < c.cp; ++r)
      bounds.back().push_back(error_bounds(in.values[r], weight, refs.back()[r]));
    for (int r = 0; r < c.cp; ++r) RC_PRE(!near_a_kink(refs.back()[r], ranks[r].advantages, ro));
  }
  const auto bundles = task.run(c.cp, encode_with(p, c));
  for (int m = 0; m < s.num_microbatches(); ++m)
    for (int r = 0; r < c.cp; ++r) {
      const reference::RankPolicyLoss& want = refs[static_cast<std::size_t>(m)][r];
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      const pool::Bundle& b = bundles[r];
      const std::string key = std::to_string(m);
      require_near(b.get(key + ".logprobs"), doubles(want.logprobs), 1e-5, 1e-5,
                   "logprobs" + where);
      // Returned where asked for or used, else 0 (the kernels skip its sums).
      const bool entropy = p.entropy != 0 || p.entropy_coef != 0;
      const at::Tensor no_entropy =
          at::zeros({static_cast<int64_t>(want.entropy.size())}, at::kDouble);
      require_near(b.get(key + ".entropy"), entropy ? doubles(want.entropy) : no_entropy,
                   entropy ? 1e-5 : 0.0, entropy ? 1e-5 : 0.0, "entropy" + where);
      require_near(b.get(key + ".ratio"), doubles(want.ratio), 1e-6, 1e-4, "ratio" + where);
      require_near(b.get(key + ".clipped"), doubles(want.clipped), 0, 0, "clipped" + where);
      require_near(b.get(key + ".kl"), doubles(want.kl), 1e-5, 1e-4, "kl" + where);
      // The bounds above hold d J / d lp itself exact; where its terms cancel (the policy
      // term against the KL term) its own float error, from lp's, is what remains: at most
      // kFloor at the generator's scales (thousands of cases).
      constexpr double kFloor = 1e-5;
      const ErrorBounds& e = bounds[static_cast<std::size_t>(m)][r];
      require_near(b.get(key + ".loss"), doubles({want.loss}), std::max(e.loss, kFloor), 1e-4,
                   "loss" + where);
      // bf16 gradients are the fp32 ones rounded once (8 bits of mantissa: 2^-8 relative).
      const double grad_rtol = p.bf16 ? 8e-3 : 1e-3;
      const at::Tensor dhidden = b.get(key + ".dhidden");
      const at::Tensor want_dhidden = to_tensor(want.grad_hidden);
      for (int64_t i = 0; i < dhidden.size(0); ++i)
        require_near(dhidden[i], want_dhidden[i],
                     std::max(e.dhidden[static_cast<std::size_t>(i)], kFloor), grad_rtol,
                     "d hidden row " + std::to_string(i) + where);
      require_near(b.get(key + ".dweight"), to_tensor(want.grad_weight),
                   std::max(e.dweight, kFloor), grad_rtol, "d weight" + where);
    }
}

rc::Gen<PolicyParams> gen_policy_params() {
  return rc::gen::exec([] {
    PolicyParams p;
    p.hidden = *rc::gen::element(1, 4, *rc::gen::inRange(1, 17));
    p.kind = *rc::gen::inRange(0, 3);
    p.kl = *rc::gen::inRange(0, 3);
    p.aggregation = *rc::gen::inRange(0, 4);
    p.kl_coef = *rc::gen::element(0.0, 0.05);
    p.tis_cap = *rc::gen::element(0.0, 2.0);
    p.entropy_coef = *rc::gen::element(0.0, 0.01);
    p.dual_clip = *rc::gen::element(0.0, 3.0);
    p.eps_high = *rc::gen::element(0.2, 0.28);
    p.chunk_rows = *rc::gen::element(0, 1, *rc::gen::inRange(1, 40));
    p.bf16 = *rc::gen::element(0, 0, 1);
    p.entropy = *rc::gen::element(0, 1);
    return p;
  });
}

void check_bshd(const BshdCase& c, const PolicyParams& p) {
  check_policy(c, reference::prepare_cp_inputs(make_batch(c), harness::options_of(c)), policy_bshd,
               p);
}

void check_packed(const PackedCase& c, const PolicyParams& p) {
  check_policy(c, reference::prepare_packed_cp_inputs(make_batch(c), harness::options_of(c)),
               policy_packed, p);
}

RC_GTEST_PROP(OptimizedPolicyLoss, BshdEqualsReference, ()) {
  check_bshd(*gen_bshd_case(), *gen_policy_params());
}

RC_GTEST_PROP(OptimizedPolicyLoss, PackedEqualsReference, ()) {
  check_packed(*gen_packed_case(), *gen_policy_params());
}

// Layouts (SPEC 2b) at CP 2-8: targets and sequences follow the fragments.
RC_GTEST_PROP(OptimizedPolicyLoss, EveryLayoutEqualsReference, ()) {
  PackedCase c = *gen_packed_case();
  c.layout = *gen_packed_layout();
  c.cp = *rc::gen::inRange(2, 9);
  check_packed(c, *gen_policy_params());
}

}  // namespace
}  // namespace cpkit::harness
