// The reference's policy_loss against central differences of its own objective in double:
// J = (sum of the ranks' losses) / W, so d J / d hidden and d J / d weight must equal the
// ranks' gradients / W, for every kind, aggregation and KL estimator, a sequence split across
// the two CP ranks, at DP 1 and 2. Plus hand-checked values of small cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpkit/reference/policy_loss.hpp"
#include "cpkit/reference/token_logprobs.hpp"

namespace cpkit::reference {
namespace {

// Ranks of `dp` CP-2 groups, each a row of 6 + 6 tokens (contiguous): sequences 1 (tokens
// 0-2), 2 (3-7: across the cut), 3 (8-11); the first token of each sequence is no target.
std::vector<PolicyRankInputs> inputs(int dp, Eigen::Index V, Eigen::Index H, std::mt19937& gen) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<std::int64_t> vocab(0, V - 1);
  const std::vector<std::int64_t> ids{1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3};
  std::vector<PolicyRankInputs> out;
  for (int d = 0; d < dp; ++d)
    for (int c = 0; c < 2; ++c) {
      PolicyRankInputs r;
      r.hidden = FloatMatrix(6, H);
      for (Eigen::Index i = 0; i < r.hidden.size(); ++i)
        r.hidden.data()[i] = static_cast<float>(normal(gen));
      r.labels = IntMatrix(1, 6);
      r.valid = BoolVector(6);
      for (int j = 0; j < 6; ++j) {
        const int g = c * 6 + j;
        r.labels(0, j) = vocab(gen);
        r.valid(j) =
            g > 0 && ids[static_cast<std::size_t>(g)] == ids[static_cast<std::size_t>(g - 1)];
        r.sequence_ids.push_back(ids[static_cast<std::size_t>(g)]);
        r.advantages.push_back(normal(gen));
        r.old_logprobs.push_back(-std::log(static_cast<double>(V)) + 0.6 * normal(gen));
        r.ref_logprobs.push_back(-std::log(static_cast<double>(V)) + 0.6 * normal(gen));
        r.sampler_logprobs.push_back(r.old_logprobs.back() + 0.3 * normal(gen));
      }
      out.push_back(r);
    }
  return out;
}

double objective(const std::vector<PolicyRankInputs>& ranks, const FloatMatrix& weight,
                 const PolicyLossOptions& o) {
  double total = 0;
  for (const RankPolicyLoss& r : policy_loss(ranks, weight, o)) total += r.loss;
  return total / static_cast<double>(ranks.size());
}

// Central difference of J in float entry `x` (the step actually taken, after rounding).
template <class Set>
double difference(float& x, Set&& evaluate) {
  const float keep = x;
  x = keep + 1e-3f;
  const float up = x;
  const double j_up = evaluate();
  x = keep - 1e-3f;
  const float down = x;
  const double j_down = evaluate();
  x = keep;
  return (j_up - j_down) / (static_cast<double>(up) - static_cast<double>(down));
}

// The per-position upstreams are what the head gradients carry: token_logprobs (its own
// chain rule) fed grad_logprobs and grad_entropy gives the same d hidden and d weight.
void expect_chain_through_head(const std::vector<PolicyRankInputs>& ranks,
                               const FloatMatrix& weight, const PolicyLossOptions& o,
                               const std::vector<RankPolicyLoss>& got, const std::string& at) {
  std::vector<FloatMatrix> hidden;
  std::vector<IntMatrix> labels;
  std::vector<BoolVector> valid;
  std::vector<std::vector<double>> g_lp, g_ent;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    hidden.push_back(ranks[r].hidden);
    labels.push_back(ranks[r].labels);
    valid.push_back(ranks[r].valid);
    g_lp.push_back(got[r].grad_logprobs);
    g_ent.push_back(got[r].grad_entropy);
  }
  // token_logprobs sees one CP group at a time: ranks are DP-major.
  for (std::size_t d = 0; d * o.cp < ranks.size(); ++d) {
    auto group = [&](const auto& v) {
      return std::vector(v.begin() + static_cast<std::ptrdiff_t>(d * o.cp),
                         v.begin() + static_cast<std::ptrdiff_t>((d + 1) * o.cp));
    };
    const auto chained = token_logprobs(group(hidden), weight, group(labels), group(valid),
                                        group(g_lp), group(g_ent), {o.softcap, o.temperature});
    for (std::size_t c = 0; c < chained.size(); ++c) {
      const RankPolicyLoss& want = got[d * o.cp + c];
      EXPECT_TRUE(chained[c].grad_hidden.isApprox(want.grad_hidden, 1e-5f))
          << at << " rank " << d * o.cp + c << " d hidden";
      EXPECT_TRUE(chained[c].grad_weight.isApprox(want.grad_weight, 1e-5f))
          << at << " rank " << d * o.cp + c << " d weight";
    }
  }
}

TEST(ReferencePolicyLoss, GradientsAreTheObjectivesDerivative) {
  std::mt19937 gen(11);
  const Eigen::Index V = 7, H = 3;
  int cases = 0;
  for (const int dp : {1, 2})
    for (const std::string kind : {"ppo", "cispo", "gspo"})
      for (const std::string aggregation :
           {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant"})
        for (const std::string kl : {"k1", "k2", "k3"}) {
          PolicyLossOptions o;
          o.kind = kind;
          o.aggregation = aggregation;
          o.divisor = 13.0;
          o.kl = kl;
          o.kl_coef = 0.1;
          o.entropy_coef = 0.01;
          o.tis_cap = kind == "cispo" ? 2.0 : 0.0;
          o.dual_clip = kind == "ppo" ? 3.0 : 0.0;
          o.eps_high = 0.28;
          // CISPO's weight carries no gradient (sg), so J's derivative is its gradient only
          // where the weight is constant: clip everything to 1 (the weight is checked by hand).
          if (kind == "cispo") o.eps_low = o.eps_high = 0.0;
          o.softcap = 4.0;
          o.temperature = 0.9;
          o.cp = 2;
          std::vector<PolicyRankInputs> ranks = inputs(dp, V, H, gen);
          FloatMatrix weight(V, H);
          for (Eigen::Index i = 0; i < weight.size(); ++i)
            weight.data()[i] = static_cast<float>(std::normal_distribution<double>(0, 1)(gen));
          const auto got = policy_loss(ranks, weight, o);
          const double W = static_cast<double>(ranks.size());
          const std::string at = kind + " " + aggregation + " " + kl + " dp " + std::to_string(dp);
          auto J = [&] { return objective(ranks, weight, o); };
          for (std::size_t r = 0; r < ranks.size(); ++r)
            for (const Eigen::Index i : {Eigen::Index{1}, Eigen::Index{4}, Eigen::Index{5}}) {
              const double want = difference(ranks[r].hidden(i, 1), J);
              EXPECT_NEAR(got[r].grad_hidden(i, 1) / W, want, 2e-4 * (1 + std::abs(want)))
                  << at << " rank " << r << " d hidden row " << i;
            }
          for (const Eigen::Index v : {Eigen::Index{0}, Eigen::Index{3}}) {
            double sum = 0;
            for (const RankPolicyLoss& r : got) sum += r.grad_weight(v, 2);
            const double want = difference(weight(v, 2), J);
            EXPECT_NEAR(sum / W, want, 2e-4 * (1 + std::abs(want))) << at << " d weight " << v;
          }
          expect_chain_through_head(ranks, weight, o, got, at);
          ++cases;
        }
  EXPECT_EQ(cases, 72);
}

// One CP rank, one row of 3 tokens, V = 2, zero hidden states: every logit is 0, so every
// log-probability is log(1/2) and every entropy log 2; the targets are tokens 1 and 2.
TEST(ReferencePolicyLoss, HandCheckedPpoTokenMean) {
  PolicyRankInputs r;
  r.hidden = FloatMatrix::Zero(3, 2);
  r.labels = IntMatrix(1, 3);
  r.labels << 0, 1, 0;
  r.valid = BoolVector(3);
  r.valid << false, true, true;
  r.advantages = {1.0, -2.0, 0.0};
  // Ratios exp(log(1/2) - old): 2 (clipped at 1.2 with A = 1) and 0.5 (A = -2: 0.8 bound).
  r.old_logprobs = {std::log(0.25), std::log(1.0), 0.0};
  PolicyLossOptions o;
  const auto got = policy_loss({r}, FloatMatrix::Zero(2, 2), o);
  // Position 0: max(-1 * 2, -1 * 1.2) = -1.2 (clipped); position 1: max(1.0, 1.6) = 1.6
  // (clipped: 0.5 is below 0.8). Token mean over 2: (-1.2 + 1.6) / 2.
  EXPECT_NEAR(got[0].loss, 0.2, 1e-12);
  EXPECT_NEAR(got[0].ratio[0], 2.0, 1e-12);
  EXPECT_NEAR(got[0].ratio[1], 0.5, 1e-12);
  EXPECT_EQ(got[0].clipped[0], 1.0);
  EXPECT_EQ(got[0].clipped[1], 1.0);
  EXPECT_EQ(got[0].ratio[2], 0.0);  // no target
  EXPECT_NEAR(got[0].entropy[0], std::log(2.0), 1e-12);
  EXPECT_TRUE(got[0].grad_hidden.isZero());  // both terms clipped: no gradient
}

// CISPO's clipped weight scales the gradient of log-probability without being differentiated:
// with zero hidden states (lp = log(1/2), p = 1/2 at V = 2) and the weight's row 0 = (1, 0),
// d loss / d hidden[i] = -w_i A_i (onehot - p) . weight / N for the one counted position.
TEST(ReferencePolicyLoss, HandCheckedCispoWeightIsNotDifferentiated) {
  PolicyRankInputs r;
  r.hidden = FloatMatrix::Zero(2, 2);
  r.labels = IntMatrix(1, 2);
  r.labels << 0, 0;
  r.valid = BoolVector(2);
  r.valid << false, true;
  r.advantages = {3.0, 0.0};
  r.old_logprobs = {std::log(0.25), 0.0};  // ratio 2: clipped to 1.2
  FloatMatrix weight(2, 2);
  weight << 1, 0, 0, 1;
  PolicyLossOptions o;
  o.kind = "cispo";
  const auto got = policy_loss({r}, weight, o);
  EXPECT_NEAR(got[0].loss, -1.2 * 3.0 * std::log(0.5), 1e-12);
  EXPECT_EQ(got[0].clipped[0], 1.0);
  // d loss / d lp = -1.2 * 3; d lp / d z = onehot(0) - p = (1/2, -1/2); d z / d hidden = weight.
  EXPECT_NEAR(got[0].grad_hidden(0, 0), -3.6 * 0.5, 1e-6);
  EXPECT_NEAR(got[0].grad_hidden(0, 1), -3.6 * -0.5, 1e-6);
}

TEST(ReferencePolicyLoss, BadOptionsAreNamed) {
  std::mt19937 gen(3);
  const auto ranks = inputs(1, 5, 2, gen);
  const FloatMatrix weight = FloatMatrix::Ones(5, 2);
  auto rejects = [&](PolicyLossOptions o, const std::string& argument) {
    o.cp = 2;
    try {
      (void)policy_loss(ranks, weight, o);
      ADD_FAILURE() << argument << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("'" + argument + "'"), std::string::npos) << e.what();
    }
  };
  PolicyLossOptions o;
  o.kind = "reinforce";
  rejects(o, "kind");
  o = {};
  o.eps_low = 1.0;
  rejects(o, "eps_low");
  o = {};
  o.dual_clip = 0.5;
  rejects(o, "dual_clip");
  o = {};
  o.aggregation = "constant";
  rejects(o, "divisor");
  o = {};
  o.kl = "k4";
  rejects(o, "kl");
}

}  // namespace
}  // namespace cpkit::reference
