// gather_tokens over real Gloo rank processes, CP in {1, 2, 3, 4}.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using testing::expect_all_ranks_ok;
using testing::require;
using testing::require_close;
using testing::require_equal;
using testing::run_ranks;

// Every rank can rebuild every other rank's input from the seed.
at::Tensor rank_value(int rank, int64_t tokens, at::ScalarType dtype) {
  at::manual_seed(1000 + rank);
  return at::randn({tokens, 3, 2}).to(dtype);
}

class GatherTokensTest : public ::testing::TestWithParam<int> {};

TEST_P(GatherTokensTest, ForwardIsRankOrderConcatenation) {
  const int world = GetParam();
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      std::vector<at::Tensor> all;
      for (int r = 0; r < world; ++r) all.push_back(rank_value(r, 5, dtype));
      const at::Tensor gathered = gather_tokens(all[rank], mesh, /*differentiable=*/false);
      require_equal(gathered, at::cat(all, 0), "gathered rows");
      require(!gathered.requires_grad(), "non-differentiable gather has no graph");
    }
  }));
}

TEST_P(GatherTokensTest, BackwardSumsEveryRanksGradientOntoTheOwner) {
  const int world = GetParam();
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    const int64_t n = 4;
    at::Tensor value = rank_value(rank, n, at::kFloat).requires_grad_(true);
    const at::Tensor gathered = gather_tokens(value, mesh, /*differentiable=*/true);
    require(gathered.requires_grad(), "differentiable gather keeps the graph");
    // Upstream weighted by (rank + 1): a mean or a narrow instead of the sum is caught.
    auto upstream = [&](int r) {
      at::manual_seed(2000 + r);
      return at::randn(gathered.sizes()) * static_cast<double>(r + 1);
    };
    (gathered * upstream(rank)).sum().backward();
    at::Tensor expected = at::zeros_like(value);
    for (int q = 0; q < world; ++q) expected += upstream(q).narrow(0, rank * n, n);
    require_close(value.grad(), expected, 1e-6, 1e-6, "owner gradient");
  }));
}

// Mismatches need at least two ranks.
class GatherMismatchTest : public ::testing::TestWithParam<int> {};

TEST_P(GatherMismatchTest, DifferentCountsRaiseOnEveryRank) {
  const int world = GetParam();
  expect_all_ranks_ok(run_ranks(world, [](int rank, const MeshPtr& mesh) {
    try {
      gather_tokens(at::zeros({rank + 1, 2}), mesh, true);
    } catch (const Error& e) {
      require(e.argument() == "value", "argument named");
      require(std::string(e.what()).find("the token count (dimension 0) is ") != std::string::npos,
              e.what());
      return;
    }
    throw std::runtime_error("no error for counts that differ across ranks");
  }));
}

TEST_P(GatherMismatchTest, DifferentTrailingShapesRaiseOnEveryRank) {
  const int world = GetParam();
  expect_all_ranks_ok(run_ranks(world, [](int rank, const MeshPtr& mesh) {
    try {
      gather_tokens(at::zeros({3, rank + 1}), mesh, false);
    } catch (const Error& e) {
      require(std::string(e.what()).find("dimension 1 is ") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("no error for trailing shapes that differ across ranks");
  }));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, GatherTokensTest, ::testing::Values(1, 2, 3, 4));
INSTANTIATE_TEST_SUITE_P(CpSizes, GatherMismatchTest, ::testing::Values(2, 3, 4));

TEST(GatherTokensNoMesh, IsIdentity) {
  const at::Tensor v = at::randn({3, 2}).requires_grad_(true);
  EXPECT_TRUE(at::equal(gather_tokens(v, nullptr, true), v));
  EXPECT_FALSE(gather_tokens(v, nullptr, false).requires_grad());
}

}  // namespace
}  // namespace cpkit
