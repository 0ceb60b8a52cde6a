// The per-key arithmetic cp_attention's CPU and CUDA kernels share (kernels/attention_math.hpp),
// run on the CPU against double: the soft cap's value and slope, and the online softmax over
// a stream of scores (from nothing seen, and from a sink) against a log-sum-exp in one pass,
// with the running weighted sum rescaled by each step's factor.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention_math.hpp"

namespace cpkit::kernels {
namespace {

TEST(AttentionMath, ScoreIsScaledAndSoftCappedWithItsSlope) {
  const AttentionScore plain = attention_score(3.0f, 0.5f, 0.0f);
  EXPECT_FLOAT_EQ(plain.value, 1.5f);
  EXPECT_FLOAT_EQ(plain.slope, 1.0f);
  for (const float dot : {-90.0f, -3.0f, 0.0f, 0.7f, 12.0f, 400.0f}) {
    const double cap = 5.0, s = dot * 0.25;
    const AttentionScore capped = attention_score(dot, 0.25f, 5.0f);
    EXPECT_NEAR(capped.value, cap * std::tanh(s / cap), 1e-5) << dot;
    // The slope is d value / d s: a central difference in double.
    const double h = 1e-4;
    const double slope =
        (cap * std::tanh((s + h) / cap) - cap * std::tanh((s - h) / cap)) / (2 * h);
    EXPECT_NEAR(capped.slope, slope, 1e-5) << dot;
    EXPECT_LE(std::abs(capped.value), 5.0f);
  }
}

// Runs the online softmax over `scores` from `start`, carrying a weighted sum of `values` the
// way the kernels do (times the factor, plus p * value); returns {lse, weighted mean}.
std::pair<double, double> online(const std::vector<float>& scores, const std::vector<float>& values,
                                 OnlineRow row) {
  float acc = 0.0f;
  for (std::size_t j = 0; j < scores.size(); ++j) {
    float p = 0.0f;
    const float shrink = online_step(row, scores[j], p);
    acc = acc * shrink + p * values[j];
  }
  return {row.max + std::log(static_cast<double>(row.sum)), acc / row.sum};
}

TEST(AttentionMath, OnlineStepsEqualOnePassSoftmax) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + trial % 17;
    std::vector<float> scores(n), values(n);
    for (std::size_t j = 0; j < n; ++j) {
      scores[j] = normal(gen);
      values[j] = normal(gen);
    }
    for (const bool sink : {false, true}) {
      const float sink_logit = normal(gen);
      double m = sink ? sink_logit : -INFINITY;
      for (const float s : scores) m = std::max(m, static_cast<double>(s));
      double z = sink ? std::exp(sink_logit - m) : 0.0, weighted = 0.0;
      for (std::size_t j = 0; j < n; ++j) {
        z += std::exp(scores[j] - m);
        weighted += std::exp(scores[j] - m) * values[j];
      }
      const auto [lse, mean] =
          online(scores, values, sink ? OnlineRow{sink_logit, 1.0f} : OnlineRow{-INFINITY, 0.0f});
      EXPECT_NEAR(lse, m + std::log(z), 1e-5) << "trial " << trial << " sink " << sink;
      EXPECT_NEAR(mean, weighted / z, 1e-4 * (1 + std::abs(weighted / z)))
          << "trial " << trial << " sink " << sink;
    }
  }
}

TEST(AttentionMath, FirstKeyAfterNothingSeenGivesFactorZeroNotNan) {
  OnlineRow row{-INFINITY, 0.0f};
  float p = -1.0f;
  const float shrink = online_step(row, 2.0f, p);
  EXPECT_EQ(shrink, 0.0f);
  EXPECT_EQ(p, 1.0f);
  EXPECT_EQ(row.max, 2.0f);
  EXPECT_EQ(row.sum, 1.0f);
  // A key below the max leaves the running sum's scale alone.
  EXPECT_EQ(online_step(row, 1.0f, p), 1.0f);
  EXPECT_FLOAT_EQ(p, std::exp(-1.0f));
}

}  // namespace
}  // namespace cpkit::kernels
