// shifted_cp_loss over real Gloo rank processes, CP in {1, 2, 3, 4}, against LibTorch's own
// cross_entropy (with autograd) on the whole unsharded batch.
#include <gtest/gtest.h>

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/loss.hpp"
#include "largest_allocation.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using testing::expect_all_ranks_ok;
using testing::require;
using testing::require_close;
using testing::run_ranks;

struct GlobalCase {
  at::Tensor logits;  // [B, S_pad, V]
  at::Tensor labels;  // [B, S_pad], -100 on padding
  at::Tensor valid;   // [B, S_pad]
  int64_t seq_len;
};

// A BSHD batch padded to a multiple of `cp`, some labels ignored, last tokens padding.
GlobalCase make_case(int cp, int64_t B, int64_t S, int64_t V, double logit_scale,
                     bool all_ignored) {
  at::manual_seed(77);
  const int64_t S_pad = (S + cp - 1) / cp * cp;
  GlobalCase c;
  c.seq_len = S;
  c.logits = at::randn({B, S_pad, V}) * logit_scale;
  c.labels = at::randint(0, V, {B, S_pad}, at::kLong);
  c.labels.masked_fill_(at::rand({B, S_pad}) < 0.2, -100);
  if (all_ignored) c.labels.fill_(-100);
  c.labels.narrow(1, S, S_pad - S).fill_(-100);
  c.valid = c.labels != -100;
  c.valid.select(1, 0).fill_(false);
  return c;
}

// HF shifted mean CE on the unpadded batch: logits[:, :-1] predict labels[:, 1:].
std::pair<at::Tensor, at::Tensor> truth(const GlobalCase& c) {
  const at::Tensor logits = c.logits.narrow(1, 0, c.seq_len).detach().requires_grad_(true);
  const at::Tensor labels = c.labels.narrow(1, 0, c.seq_len);
  const int64_t V = logits.size(2);
  const at::Tensor shift_logits = logits.narrow(1, 0, c.seq_len - 1).reshape({-1, V});
  const at::Tensor shift_labels = labels.narrow(1, 1, c.seq_len - 1).reshape({-1});
  at::Tensor loss;
  if ((shift_labels != -100).any().item<bool>()) {
    loss = at::cross_entropy_loss(shift_logits, shift_labels, {}, at::Reduction::Mean, -100);
    loss.backward();
  } else {
    loss = at::zeros({});
  }
  at::Tensor grad = at::zeros_like(c.logits);
  if (logits.grad().defined()) grad.narrow(1, 0, c.seq_len).copy_(logits.grad());
  return {loss.detach(), grad};
}

void check_rank(int rank, const MeshPtr& mesh, int64_t B, int64_t S, int64_t V, double scale,
                bool all_ignored) {
  const int cp = cp_size(mesh);
  const GlobalCase c = make_case(cp, B, S, V, scale, all_ignored);
  const int64_t L = c.logits.size(1) / cp;
  const at::Tensor logits = c.logits.narrow(1, rank * L, L).contiguous().requires_grad_(true);
  const at::Tensor labels = c.labels.narrow(1, rank * L, L).contiguous();
  const at::Tensor valid = c.valid.narrow(1, rank * L, L).reshape({-1}).contiguous();
  const at::Tensor loss = shifted_cp_loss(logits, labels, valid, mesh);
  require(std::isfinite(loss.item<float>()), "finite loss");
  loss.backward();

  // Mean over ranks of the returned values, through the mesh itself.
  at::Tensor mean = loss.detach().reshape({1}).clone() / cp;
  if (cp > 1) mesh->all_reduce_sum(mean.data_ptr(), 1, ScalarKind::kFloat32);
  const auto [expected_loss, expected_grad] = truth(c);
  require_close(mean, expected_loss.reshape({1}), 1e-5, 1e-5, "mean loss over ranks");
  require_close(logits.grad() / cp, expected_grad.narrow(1, rank * L, L), 1e-7, 1e-4,
                "logits gradient / CP");
  if (all_ignored) {
    require(loss.item<float>() == 0.0f, "exactly zero loss without targets");
    require(logits.grad().eq(0).all().item<bool>(), "zero gradient without targets");
  }
}

CPKIT_TEST_AT_CP_SIZES(ShiftedLossTest, MeanOverRanksEqualsTorchCrossEntropy, 1, 2, 3, 4) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    check_rank(rank, mesh, 2, 11, 37, 1.0, false);
  }));
}

CPKIT_TEST_AT_CP_SIZES(ShiftedLossTest, LargeLogitsStayFinite, 1, 2, 3, 4) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    check_rank(rank, mesh, 1, 9, 50, 1e4, false);
  }));
}

CPKIT_TEST_AT_CP_SIZES(ShiftedLossTest, AllIgnoredGivesExactZero, 1, 2, 3, 4) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    check_rank(rank, mesh, 2, 6, 5, 1.0, true);
  }));
}

CPKIT_TEST_AT_CP_SIZES(ShiftedLossTest, ShortSequenceLeavesRanksEmpty, 1, 2, 3, 4) {
  // S = 2 < CP for CP >= 3: some ranks hold only padding.
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int rank, const MeshPtr& mesh) {
    check_rank(rank, mesh, 3, 2, 7, 1.0, false);
  }));
}

TEST(ShiftedLossSoftcap, MatchesCappingBeforeTheLoss) {
  at::manual_seed(5);
  const at::Tensor raw = (at::randn({1, 6, 9}) * 80).requires_grad_(true);
  const at::Tensor labels = at::randint(0, 9, {1, 6}, at::kLong);
  at::Tensor valid = at::ones({6}, at::kBool);
  valid[0] = false;
  const at::Tensor fused = shifted_cp_loss(raw, labels, valid, nullptr, {.softcap = 30.0});
  fused.backward();
  const at::Tensor fused_grad = raw.grad().clone();
  raw.grad().zero_();
  const at::Tensor capped = (30.0 * at::tanh(raw / 30.0)).contiguous();
  const at::Tensor composite = shifted_cp_loss(capped, labels, valid, nullptr);
  composite.backward();
  EXPECT_NEAR(fused.item<float>(), composite.item<float>(), 1e-5);
  EXPECT_TRUE(at::allclose(fused_grad, raw.grad(), 1e-5, 1e-7));
}

}  // namespace
}  // namespace cpkit

namespace cpkit {
namespace {

// torch::autograd::grad with an upstream gradient: backward scales the saved kernel gradient.
TEST(ShiftedLossAutograd, GradScalesByIncomingGradient) {
  at::manual_seed(8);
  const at::Tensor logits = at::randn({2, 5, 11}).requires_grad_(true);
  const at::Tensor labels = at::randint(0, 11, {2, 5}, at::kLong);
  const at::Tensor valid = at::ones({10}, at::kBool);
  auto loss = [&] { return shifted_cp_loss(logits, labels, valid, nullptr); };
  const auto once = torch::autograd::grad({loss()}, {logits}, {at::ones({})});
  for (const double upstream : {2.5, 0.0, -1.0}) {
    const auto scaled = torch::autograd::grad({loss()}, {logits}, {at::full({}, upstream)});
    EXPECT_TRUE(at::allclose(scaled[0], once[0] * upstream, 1e-6, 0)) << "upstream " << upstream;
  }
  // And it is the gradient of LibTorch's own composite.
  const at::Tensor x = logits.detach().requires_grad_(true);
  const at::Tensor composite = at::cross_entropy_loss(x.narrow(1, 0, 4).reshape({-1, 11}),
                                                      labels.narrow(1, 1, 4).reshape({-1}));
  const auto expected = torch::autograd::grad({composite}, {x});
  EXPECT_TRUE(at::allclose(once[0], expected[0], 1e-5, 1e-7));
}

// The upstream scaling is in place: backward allocates nothing near the [B, L, V] gradient,
// whatever the upstream (1 skips the pass; others scale the saved gradient where it is).
TEST(ShiftedLossAutograd, BackwardAllocatesNoSecondLogitsBuffer) {
  at::manual_seed(9);
  const int64_t B = 2, L = 512, V = 1000;
  const at::Tensor logits = at::randn({B, L, V}).requires_grad_(true);
  const at::Tensor labels = at::randint(0, V, {B, L}, at::kLong);
  const at::Tensor valid = at::ones({B * L}, at::kBool);
  const at::Tensor unit = torch::autograd::grad({shifted_cp_loss(logits, labels, valid, nullptr)},
                                                {logits}, {at::ones({})})[0];
  for (const double upstream : {1.0, 3.0}) {
    const at::Tensor loss = shifted_cp_loss(logits, labels, valid, nullptr);
    c10::Allocator* inner = c10::GetCPUAllocator();
    testing::LargestAllocation probe(inner);
    c10::SetCPUAllocator(&probe, /*priority=*/100);
    const at::Tensor grad = torch::autograd::grad({loss}, {logits}, {at::full({}, upstream)})[0];
    c10::SetCPUAllocator(inner, /*priority=*/101);
    EXPECT_LT(probe.largest.load(), static_cast<size_t>(B * L * V) * sizeof(float) / 4)
        << "upstream " << upstream;
    EXPECT_TRUE(at::allclose(grad, unit * upstream, 1e-6, 0)) << "upstream " << upstream;
  }
}

// A second backward through a retained graph would see the gradient already scaled: it
// raises, naming retain_graph, instead of returning a wrong gradient.
TEST(ShiftedLossAutograd, SecondBackwardThroughARetainedGraphRaises) {
  const at::Tensor logits = at::randn({1, 4, 5}).requires_grad_(true);
  const at::Tensor labels = at::randint(0, 5, {1, 4}, at::kLong);
  const at::Tensor loss = shifted_cp_loss(logits, labels, at::ones({4}, at::kBool), nullptr);
  torch::autograd::grad({loss}, {logits}, {at::full({}, 2.0)}, /*retain_graph=*/true);
  try {
    torch::autograd::grad({loss}, {logits}, {at::full({}, 2.0)});
    FAIL() << "a second backward was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cpkit

namespace cpkit {
namespace {

// All-equal logits: every counted CE is ln V and the gradient is (1/V - onehot) / N.
TEST(ShiftedLossNumerics, AllEqualLogitsGiveLogV) {
  for (const float level : {0.0f, 5.0f, 1e4f, -1e4f}) {
    const at::Tensor logits = at::full({1, 5, 7}, level).requires_grad_(true);
    const at::Tensor labels =
        at::tensor(std::vector<int64_t>{0, 1, 2, 3, 6}, at::kLong).unsqueeze(0);
    const at::Tensor valid = at::ones({5}, at::kBool);
    const at::Tensor loss = shifted_cp_loss(logits, labels, valid, nullptr);
    EXPECT_NEAR(loss.item<float>(), std::log(7.0f), 1e-6) << "level " << level;
    loss.backward();
    const at::Tensor g = logits.grad()[0];
    for (int j = 0; j < 4; ++j)  // position j predicts labels[j + 1]; the last predicts nothing
      for (int v = 0; v < 7; ++v) {
        const double expected = (1.0 / 7 - (v == labels[0][j + 1].item<int64_t>() ? 1.0 : 0.0)) / 4;
        EXPECT_NEAR(g[j][v].item<float>(), expected, 1e-6) << "level " << level;
      }
    EXPECT_TRUE(g[4].eq(0).all().item<bool>());
  }
}

}  // namespace
}  // namespace cpkit
