// The arithmetic the CPU and CUDA token_logprobs kernels share (kernels/token_logprobs.hpp),
// run on the CPU: the per-logit update and the merge the CUDA threads and warps use give the
// CPU kernel's statistics; masked logits (-inf) weigh nothing in the log-probability, the
// entropy or the gradient (never NaN), and log-probabilities stay <= 0, entropies >= 0.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpkit/optimized/constants.hpp"
#include "cpu/vocab_slices.hpp"
#include "kernels/token_logprobs.hpp"
#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::kernels {
namespace {

// log-softmax of the target, entropy and the gradient of g_lp lp + g_ent H, in double over
// the unmasked entries of z (the logits themselves: no cap, t = 1).
struct Exact {
  double logprob, entropy;
  std::vector<double> grad;
};

Exact exact(const std::vector<float>& z, std::size_t target, double g_lp, double g_ent) {
  double m = -INFINITY;
  for (float v : z) m = std::max(m, static_cast<double>(v));
  double sum = 0;
  for (float v : z) sum += std::exp(v - m);
  const double lse = m + std::log(sum);
  double mean = 0;
  for (float v : z)
    if (v != -INFINITY) mean += std::exp(v - lse) * v;
  Exact e{z[target] - lse, lse - mean, {}};
  for (std::size_t k = 0; k < z.size(); ++k) {
    const double p = std::exp(z[k] - lse);
    const double centred = z[k] == -INFINITY ? 0.0 : p * (z[k] - mean);
    e.grad.push_back(g_lp * ((k == target ? 1.0 : 0.0) - p) - g_ent * centred);
  }
  return e;
}

std::vector<float> random_row(std::size_t V, double masked, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> z(V);
  for (auto& v : z) v = unit(rng) < masked ? -INFINITY : normal(rng);
  z[0] = normal(rng);  // at least one entry unmasked
  return z;
}

// The CUDA kernel's threads each fold a strided share of the row with logprob_add, then the
// warps merge them: for any thread count the result is the CPU kernel's (within float).
TEST(TokenLogprobsKernelMath, StridedSharesMergeToTheWholeRow) {
  for (const double masked : {0.0, 0.3}) {
    const std::vector<float> z = random_row(1000, masked, 3);
    const Exact want = exact(z, 0, 1, 0);
    for (const int threads : {1, 7, 32, 256}) {
      std::vector<LogprobStats> parts(static_cast<std::size_t>(threads), logprob_empty());
      for (std::size_t k = 0; k < z.size(); ++k) logprob_add(parts[k % threads], z[k]);
      LogprobStats merged = logprob_empty();
      for (const auto& p : parts) merged = logprob_merge(merged, p);
      const RowStats r = row_stats(merged);
      EXPECT_NEAR(logprob_value(z[0], r), want.logprob, 2e-5) << threads << " threads";
      EXPECT_NEAR(entropy_value(r), want.entropy, 2e-5) << threads << " threads";
    }
  }
}

// Rows with masked vocabulary entries through the CPU kernels, in place and vocab-major (the
// fused head's CPU layout; 70 tokens: a full lane group and a partial one): finite values
// equal to the distribution over the unmasked entries, 0 gradient on masked ones, lp <= 0,
// H >= 0. Vocabularies inside one slice, a whole number of slices, and one entry past them.
class TokenLogprobsVocab : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(TokenLogprobsVocab, MaskedVocabularyWeighsNothing) {
  const std::int64_t V = GetParam(), rows = 70;
  std::vector<std::vector<float>> z;
  std::vector<std::int64_t> targets;
  std::vector<float> logits(static_cast<std::size_t>(V * rows));  // [V, rows]
  for (std::int64_t r = 0; r < rows; ++r) {
    z.push_back(random_row(V, r % 6 < 3 ? 0.5 : 0.999, 10 + static_cast<std::uint32_t>(r)));
    // r % 6 == 2: maybe a masked target; r % 6 == 4: the last entry (unmasked), in the last
    // slice; r % 6 == 5: no target
    targets.push_back(r % 6 == 5 ? kIgnoreLabel : (r % 6 == 2 ? 1 : (r % 6 == 4 ? V - 1 : 0)));
    if (r % 6 == 4) z.back()[static_cast<std::size_t>(V - 1)] = z.back()[0] + 1.0f;
    for (std::int64_t v = 0; v < V; ++v) logits[v * rows + r] = z.back()[v];
  }
  std::vector<float> stats(3 * rows), lp(rows), ent(rows), g_lp(rows, 0.7f), g_ent(rows, -1.3f);
  TokenLogprobsArgs a{};
  a.logits = logits.data();
  a.targets = targets.data();
  a.rows = rows;
  a.vocab = V;
  a.inv_temperature = 1.0f;
  a.stats = stats.data();
  a.logprobs = lp.data();
  a.entropy = ent.data();
  a.vocab_major = true;
  token_logprobs_forward_cpu(a);
  a.grad_logprobs = g_lp.data();
  a.grad_entropy = g_ent.data();
  a.grad = logits.data();
  token_logprobs_backward_cpu(a);
  for (std::int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    auto g = [&](std::int64_t v) { return logits[v * rows + r]; };
    if (targets[r] == kIgnoreLabel) {
      EXPECT_EQ(lp[r], 0.0f);
      EXPECT_EQ(ent[r], 0.0f);
      for (std::int64_t k = 0; k < V; ++k) ASSERT_EQ(g(k), 0.0f);
      continue;
    }
    const Exact want = exact(z[r], static_cast<std::size_t>(targets[r]), 0.7, -1.3);
    EXPECT_LE(lp[r], 0.0f);
    EXPECT_GE(ent[r], 0.0f);
    if (std::isinf(want.logprob))
      EXPECT_EQ(lp[r], -INFINITY);  // a masked target: probability 0
    else
      EXPECT_NEAR(lp[r], want.logprob, 2e-5);
    EXPECT_NEAR(ent[r], want.entropy, 2e-5);
    for (std::int64_t k = 0; k < V; ++k) {
      ASSERT_FALSE(std::isnan(g(k))) << k;
      if (z[r][k] == -INFINITY && k != targets[r]) {
        ASSERT_EQ(g(k), 0.0f) << k;  // (a masked target keeps d lp / d z_t = g_lp)
      }
      ASSERT_NEAR(g(k), want.grad[k], 2e-5) << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SliceEdges, TokenLogprobsVocab,
                         ::testing::Values(1500, 2 * kVocabSlice, 2 * kVocabSlice + 1));

}  // namespace
}  // namespace cpkit::kernels
