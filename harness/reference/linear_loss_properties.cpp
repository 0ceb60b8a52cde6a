// SPEC 5a for the reference: shifted_cp_linear_loss's gradients against central differences,
// and the CP split leaves the mean loss and the summed head gradient unchanged.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "one_row.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;

// d value / d hidden and d value / d weight (CP = 1) against central differences of the
// value: catches a transposed or unscaled chain rule through the head and the cap.
RC_GTEST_PROP(ReferenceLinearLoss, GradientsMatchFiniteDifferences, ()) {
  const int S = *rc::gen::inRange(2, 6), V = *rc::gen::inRange(2, 6), H = *rc::gen::inRange(1, 5);
  const LossOptions options{*rc::gen::element(0.0, 1.0, 2.5)};
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  FloatMatrix hidden = random_floats(S, H, 1.0f, input_seed(seed, Input::kHidden));
  FloatMatrix weight = random_floats(V, H, 2.0f, input_seed(seed, Input::kHeadWeight));
  const IntMatrix labels = random_labels(S, V);
  auto value = [&] {
    const Split one = split(hidden, labels, 1);
    return shifted_cp_linear_loss(one.hidden, weight, one.labels, one.valid, options)[0];
  };
  const RankLinearLoss base = value();
  const bool of_weight = *rc::gen::arbitrary<bool>();
  FloatMatrix& x = of_weight ? weight : hidden;
  const auto i = *rc::gen::inRange<Eigen::Index>(0, x.rows());
  const auto k = *rc::gen::inRange<Eigen::Index>(0, H);
  const float h = 1e-2f, saved = x(i, k);
  x(i, k) = saved + h;
  const double up = value().value;
  x(i, k) = saved - h;
  const double down = value().value;
  const double numeric = (up - down) / (2 * h);
  const double analytic = of_weight ? base.grad_weight(i, k) : base.grad_hidden(i, k);
  RC_TAG(of_weight ? "weight" : "hidden");
  RC_ASSERT(std::abs(numeric - analytic) <= 2e-3 * (1 + std::abs(numeric)));
}

// Mean over ranks of the value and of d weight equal the one-device result; each rank's
// d hidden / CP equals the one-device d hidden of its rows.
RC_GTEST_PROP(ReferenceLinearLoss, CpSplitKeepsLossAndHeadGradient, ()) {
  const int cp = *rc::gen::inRange(2, 6), L = *rc::gen::inRange(1, 5);
  const int V = *rc::gen::inRange(2, 9), H = *rc::gen::inRange(1, 6);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const FloatMatrix hidden = random_floats(cp * L, H, 1.0f, input_seed(seed, Input::kHidden));
  const FloatMatrix weight = random_floats(V, H, 1.0f, input_seed(seed, Input::kHeadWeight));
  const IntMatrix labels = random_labels(cp * L, V);
  const LossOptions options{*rc::gen::element(0.0, 3.0)};
  const Split whole = split(hidden, labels, 1), parts = split(hidden, labels, cp);
  const RankLinearLoss truth =
      shifted_cp_linear_loss(whole.hidden, weight, whole.labels, whole.valid, options)[0];
  const auto ranks =
      shifted_cp_linear_loss(parts.hidden, weight, parts.labels, parts.valid, options);
  double mean = 0;
  FloatMatrix dweight = FloatMatrix::Zero(V, H);
  for (int r = 0; r < cp; ++r) {
    mean += ranks[r].value / cp;
    dweight += ranks[r].grad_weight / cp;
    const std::string e = mismatch(FloatMatrix(ranks[r].grad_hidden / cp),
                                   truth.grad_hidden.middleRows(r * L, L), 1e-6, 1e-5);
    if (!e.empty()) RC_FAIL("d hidden of rank " + std::to_string(r) + ": " + e);
  }
  RC_ASSERT(std::abs(mean - truth.value) <= 1e-9 * (1 + std::abs(truth.value)));
  const std::string e = mismatch(dweight, truth.grad_weight, 1e-6, 1e-5);
  if (!e.empty()) RC_FAIL("d weight: " + e);
}

}  // namespace
}  // namespace cpkit::harness
