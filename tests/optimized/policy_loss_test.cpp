// policy_loss beyond the reference properties: denominators over a DP mesh (two DP ranks of
// CP 1 with different batches against the reference over both), nothing counted, only the
// asked-for gradients, and its argument errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/policy_loss.hpp"
#include "cpkit/reference/policy_loss.hpp"
#include "expect_rejected.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using testing::expect_all_ranks_ok;
using testing::require_close;
using testing::run_ranks;

// DP rank d's batch: one row of 9 tokens, sequences 1 (0-3) and 2 (4-8; d = 1: one sequence),
// a label of -100, head [V = 11, H = 5].
struct DpBatch {
  at::Tensor hidden, labels, valid, ids, x;  // x [4, 1, 9]: advantages, old, ref, sampler
};

DpBatch dp_batch(int d) {
  at::manual_seed(50 + d);
  DpBatch b;
  b.hidden = at::randn({1, 9, 5});
  b.labels = at::randint(0, 11, {1, 9}, at::kLong);
  b.labels[0][6] = -100;
  b.ids = d == 0 ? at::tensor(std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2, 2}).view({1, 9})
                 : at::ones({1, 9}, at::kLong);
  b.valid = at::ones({9}, at::kBool);
  b.valid[0] = false;
  b.valid[6] = false;              // its label is -100
  if (d == 0) b.valid[4] = false;  // a sequence's first token is no target
  b.x = at::randn({4, 1, 9});
  b.x.narrow(0, 1, 3).mul_(0.6).sub_(std::log(11.0));
  return b;
}

reference::FloatMatrix floats(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  reference::FloatMatrix m(c.size(0), c.size(1));
  std::copy(c.const_data_ptr<float>(), c.const_data_ptr<float>() + c.numel(), m.data());
  return m;
}

std::vector<double> values(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous().reshape({-1});
  return {c.const_data_ptr<double>(), c.const_data_ptr<double>() + c.numel()};
}

TEST(PolicyLoss, DenominatorsSpanTheDpMesh) {
  at::manual_seed(3);
  const at::Tensor weight = at::randn({11, 5});
  for (const std::string aggregation : {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum"})
    for (const std::string kind : {"ppo", "gspo"}) {
      SCOPED_TRACE(kind + " " + aggregation);
      std::vector<reference::PolicyRankInputs> ranks;
      for (int d = 0; d < 2; ++d) {
        const DpBatch b = dp_batch(d);
        reference::PolicyRankInputs r{
            floats(b.hidden[0]), {}, {}, values(b.x[0]), values(b.x[1]), values(b.x[2]),
            values(b.x[3]),      {}};
        r.labels = reference::IntMatrix(1, 9);
        r.valid = reference::BoolVector(9);
        for (int j = 0; j < 9; ++j) {
          r.labels(0, j) = b.labels[0][j].item<int64_t>();
          r.valid(j) = b.valid[j].item<bool>();
          r.sequence_ids.push_back(b.ids[0][j].item<int64_t>());
        }
        ranks.push_back(r);
      }
      reference::PolicyLossOptions ro;
      ro.kind = kind;
      ro.aggregation = aggregation;
      ro.kl_coef = 0.1;
      ro.entropy_coef = 0.01;
      const auto want = reference::policy_loss(ranks, floats(weight), ro);
      expect_all_ranks_ok(run_ranks(2, [&](int d, const MeshPtr& world) {
        const DpBatch b = dp_batch(d);
        PolicyLossOptions o;
        o.kind = parse_policy_kind(kind);
        o.aggregation = parse_policy_aggregation(aggregation);
        o.kl_coef = 0.1;
        o.entropy_coef = 0.01;
        o.dp_mesh = world;  // DP 2, CP 1
        const at::Tensor h = b.hidden.clone().requires_grad_(true);
        const at::Tensor w = weight.clone().requires_grad_(true);
        const PolicyLoss r = policy_loss(h, w, b.labels, b.valid, nullptr,
                                         {b.x[0], b.x[1], b.x[2], b.x[3], b.ids}, o);
        r.loss.backward();
        const auto& e = want[static_cast<std::size_t>(d)];
        require_close(r.loss.to(at::kDouble).reshape({1}), at::tensor({e.loss}, at::kDouble), 1e-6,
                      1e-5, "loss");
        require_close(h.grad().reshape({9, 5}),
                      at::from_blob(const_cast<float*>(e.grad_hidden.data()), {9, 5}, at::kFloat),
                      1e-6, 1e-4, "d hidden");
        require_close(w.grad(),
                      at::from_blob(const_cast<float*>(e.grad_weight.data()), {11, 5}, at::kFloat),
                      1e-6, 1e-4, "d weight");
      }));
    }
}

TEST(PolicyLoss, NothingCountedGivesZeroLossAndGradients) {
  const at::Tensor h = at::randn({1, 4, 3}).requires_grad_(true);
  const at::Tensor w = at::randn({7, 3}).requires_grad_(true);
  const at::Tensor x = at::full({1, 4}, NAN);  // never read: no position counts
  const PolicyLoss r = policy_loss(h, w, at::full({1, 4}, -100, at::kLong),
                                   at::zeros({4}, at::kBool), nullptr, {x, x, {}, {}, {}}, {});
  r.loss.backward();
  EXPECT_EQ(r.loss.item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(h.grad(), at::zeros_like(h)));
  EXPECT_TRUE(at::equal(w.grad(), at::zeros_like(w)));
  EXPECT_TRUE(at::equal(r.ratio, at::zeros({1, 4})));
}

TEST(PolicyLoss, OnlyTheAskedForGradients) {
  const at::Tensor x = at::zeros({1, 4});
  const auto r = policy_loss_with_grad(
      at::randn({1, 4, 3}), at::randn({7, 3}), at::randint(0, 7, {1, 4}, at::kLong),
      at::ones({4}, at::kBool), nullptr, {x, x, {}, {}, {}}, {}, {.hidden = false, .weight = true});
  EXPECT_FALSE(r.grad_hidden.defined());
  EXPECT_TRUE(r.grad_weight.defined());
}

TEST(PolicyLoss, BadInputsAreNamed) {
  const at::Tensor h = at::randn({1, 4, 3}), w = at::randn({7, 3});
  const at::Tensor labels = at::randint(0, 7, {1, 4}, at::kLong), valid = at::ones({4}, at::kBool);
  const at::Tensor x = at::zeros({1, 4});
  auto call = [&](const PolicyLossInputs& in, const PolicyLossOptions& o) {
    (void)policy_loss(h, w, labels, valid, nullptr, in, o);
  };
  at::Tensor nan = x.clone();
  nan[0][1] = NAN;
  test::expect_rejected<Error>(
      [&] {
        call({nan, x, {}, {}, {}}, {});
      },
      "advantages", {"nan", "position 1"});
  test::expect_rejected<Error>(
      [&] {
        call({at::zeros({1, 3}), x, {}, {}, {}}, {});
      },
      "advantages", {"[1, 4]", "[1, 3]"});
  test::expect_rejected<Error>(
      [&] {
        call({x, x.to(at::kDouble), {}, {}, {}}, {});
      },
      "old_logprobs", {"Double"});
  PolicyLossOptions o;
  o.kl_coef = 0.1;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "ref_logprobs", {});
  o = {};
  o.tis_cap = 2;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "sampler_logprobs", {});
  o = {};
  o.aggregation = PolicyAggregation::kSeqMeanTokenSum;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "sequence_ids", {});
  test::expect_rejected<Error>(
      [&] {
        call({x, x, {}, {}, at::zeros({1, 4}, at::kLong)}, o);
      },
      "sequence_ids", {"is 0"});
  o = {};
  o.eps_low = 1.0;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "eps_low", {"[0, 1)"});
  o = {};
  o.dual_clip = 0.5;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "dual_clip", {"0.5"});
  o = {};
  o.aggregation = PolicyAggregation::kConstant;
  test::expect_rejected<Error>([&] { call({x, x, {}, {}, {}}, o); }, "divisor", {"> 0"});
  test::expect_rejected<Error>([&] { parse_policy_kind("grpo"); }, "kind", {"\"grpo\""});
  test::expect_rejected<Error>([&] { parse_kl_estimator("k4"); }, "kl", {"k4"});
  test::expect_rejected<Error>([&] { parse_policy_aggregation("mean"); }, "aggregation", {"mean"});
}

}  // namespace
}  // namespace cpkit
