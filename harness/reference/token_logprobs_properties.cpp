// SPEC 5b for the reference: token_logprobs against independent truths. Each log-probability
// is minus the reference linear loss of a batch holding that one target (section 5a, itself
// checked against HF's loss); the gradients of any weighted sum of log-probabilities and
// entropies match central differences; a CP split changes no position's values.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "one_row.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;

std::vector<std::vector<double>> upstream(int cp, Eigen::Index n, double value) {
  return std::vector<std::vector<double>>(static_cast<std::size_t>(cp),
                                          std::vector<double>(static_cast<std::size_t>(n), value));
}

// logprob(t) = -CE at t: the linear loss of a batch whose only counted target is t's (N = 1,
// CP = 1: its value is that CE), with the temperature folded into the head (no cap: z / t is
// then (h @ (W / t)^T)). Entropy >= 0 and logprob <= 0 everywhere.
RC_GTEST_PROP(ReferenceTokenLogprobs, LogprobIsMinusTheOneTargetLoss, ()) {
  const int S = *rc::gen::inRange(2, 7), V = *rc::gen::inRange(2, 9), H = *rc::gen::inRange(1, 5);
  const double temperature = *rc::gen::element(1.0, 0.7, 2.0);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const FloatMatrix hidden = random_floats(S, H, 1.0f, input_seed(seed, Input::kHidden));
  const FloatMatrix weight = random_floats(V, H, 3.0f, input_seed(seed, Input::kHeadWeight));
  const IntMatrix labels = random_labels(S, V);
  const Split one = split(hidden, labels, 1);
  const auto got = token_logprobs(one.hidden, weight, one.labels, one.valid, upstream(1, S, 0),
                                  upstream(1, S, 0), {0.0, temperature, {}})[0];
  const FloatMatrix tempered = (weight.cast<double>() / temperature).cast<float>();
  for (int i = 0; i < S; ++i) {
    const bool counted = i + 1 < S && labels(0, i + 1) != kIgnoreLabel;
    RC_ASSERT(got.has_target[i] == counted);
    RC_ASSERT(got.logprobs[i] <= 0.0);
    RC_ASSERT(got.entropy[i] >= 0.0);
    if (!counted) {
      RC_ASSERT(got.logprobs[i] == 0.0 && got.entropy[i] == 0.0);
      continue;
    }
    IntMatrix only = IntMatrix::Constant(1, S, kIgnoreLabel);
    only(0, i + 1) = labels(0, i + 1);
    const Split single = split(hidden, only, 1);
    const double ce =
        shifted_cp_linear_loss(single.hidden, tempered, single.labels, single.valid)[0].value;
    // The folded head is rounded to float once: a relative 2^-24 per weight.
    RC_ASSERT(std::abs(got.logprobs[i] + ce) <= 1e-5 * (1 + std::abs(ce)));
  }
}

// d(sum g_lp logprob + g_ent entropy) / d hidden and / d weight against central differences
// of that sum: catches a wrong sign, a missing 1 / t or cap factor, a transposed head.
RC_GTEST_PROP(ReferenceTokenLogprobs, GradientsMatchFiniteDifferences, ()) {
  const int S = *rc::gen::inRange(2, 6), V = *rc::gen::inRange(2, 6), H = *rc::gen::inRange(1, 5);
  const TokenLogprobsOptions options{
      *rc::gen::element(0.0, 1.0, 2.5), *rc::gen::element(1.0, 0.6, 1.7), {}};
  const double g_lp = *rc::gen::element(1.0, -0.5, 0.0), g_ent = *rc::gen::element(0.0, 0.8);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  FloatMatrix hidden = random_floats(S, H, 1.0f, input_seed(seed, Input::kHidden));
  FloatMatrix weight = random_floats(V, H, 2.0f, input_seed(seed, Input::kHeadWeight));
  const IntMatrix labels = random_labels(S, V);
  auto run = [&] {
    const Split one = split(hidden, labels, 1);
    return token_logprobs(one.hidden, weight, one.labels, one.valid, upstream(1, S, g_lp),
                          upstream(1, S, g_ent), options)[0];
  };
  auto value = [&] {
    const RankTokenLogprobs o = run();
    double sum = 0;
    for (int i = 0; i < S; ++i) sum += g_lp * o.logprobs[i] + g_ent * o.entropy[i];
    return sum;
  };
  const RankTokenLogprobs base = run();
  const bool of_weight = *rc::gen::arbitrary<bool>();
  FloatMatrix& x = of_weight ? weight : hidden;
  const auto i = *rc::gen::inRange<Eigen::Index>(0, x.rows());
  const auto k = *rc::gen::inRange<Eigen::Index>(0, H);
  const float h = 1e-2f, saved = x(i, k);
  x(i, k) = saved + h;
  const double up = value();
  x(i, k) = saved - h;
  const double down = value();
  const double numeric = (up - down) / (2 * h);
  const double analytic = of_weight ? base.grad_weight(i, k) : base.grad_hidden(i, k);
  RC_TAG(of_weight ? "weight" : "hidden");
  RC_ASSERT(std::abs(numeric - analytic) <= 3e-3 * (1 + std::abs(numeric)));
}

// Each rank's positions keep their one-device values (the boundary target comes from the next
// rank); d weight summed over ranks is the one-device d weight.
RC_GTEST_PROP(ReferenceTokenLogprobs, CpSplitKeepsValuesAndGradients, ()) {
  const int cp = *rc::gen::inRange(2, 6), L = *rc::gen::inRange(1, 5);
  const int V = *rc::gen::inRange(2, 9), H = *rc::gen::inRange(1, 6);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const FloatMatrix hidden = random_floats(cp * L, H, 1.0f, input_seed(seed, Input::kHidden));
  const FloatMatrix weight = random_floats(V, H, 1.0f, input_seed(seed, Input::kHeadWeight));
  const IntMatrix labels = random_labels(cp * L, V);
  const TokenLogprobsOptions options{*rc::gen::element(0.0, 3.0), *rc::gen::element(1.0, 0.5), {}};
  const Split whole = split(hidden, labels, 1), parts = split(hidden, labels, cp);
  const auto truth = token_logprobs(whole.hidden, weight, whole.labels, whole.valid,
                                    upstream(1, cp * L, 1.0), upstream(1, cp * L, 0.5), options)[0];
  const auto ranks = token_logprobs(parts.hidden, weight, parts.labels, parts.valid,
                                    upstream(cp, L, 1.0), upstream(cp, L, 0.5), options);
  FloatMatrix dweight = FloatMatrix::Zero(V, H);
  for (int r = 0; r < cp; ++r) {
    dweight += ranks[r].grad_weight;
    for (int j = 0; j < L; ++j) {
      const auto g = static_cast<std::size_t>(r * L + j);
      RC_ASSERT(ranks[r].has_target[j] == truth.has_target[g]);
      RC_ASSERT(std::abs(ranks[r].logprobs[j] - truth.logprobs[g]) <= 1e-12);
      RC_ASSERT(std::abs(ranks[r].entropy[j] - truth.entropy[g]) <= 1e-12);
    }
    const std::string e =
        mismatch(ranks[r].grad_hidden, truth.grad_hidden.middleRows(r * L, L), 1e-6, 1e-5);
    if (!e.empty()) RC_FAIL("d hidden of rank " + std::to_string(r) + ": " + e);
  }
  const std::string e = mismatch(dweight, truth.grad_weight, 1e-6, 1e-5);
  if (!e.empty()) RC_FAIL("d weight: " + e);
}

}  // namespace
}  // namespace cpkit::harness
