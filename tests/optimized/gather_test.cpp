// gather_tokens over real Gloo rank processes, CP in {1, 2, 3, 4}.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/validation.hpp"
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

CPKIT_TEST_AT_CP_SIZES(GatherTokensTest, ForwardIsRankOrderConcatenation, 1, 2, 3, 4) {
  const int world = cp_size_param;
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

// Every dtype torch.distributed.all_gather moves travels as its bytes: float64, int32, int8,
// float8 and bool, compared in double (float8 has no equality kernel of its own).
CPKIT_TEST_AT_CP_SIZES(GatherTokensTest, ForwardMovesEveryDtype, 1, 2, 3, 4) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    for (auto dtype : {at::kDouble, at::kInt, at::kChar, at::kFloat8_e4m3fn, at::kBool}) {
      std::vector<at::Tensor> all;
      for (int r = 0; r < world; ++r) all.push_back(rank_value(r, 5, dtype));
      const at::Tensor gathered = gather_tokens(all[rank], mesh, /*differentiable=*/false);
      require(gathered.scalar_type() == dtype, "keeps the dtype");
      require_equal(gathered.to(at::kDouble), at::cat(all, 0).to(at::kDouble), "gathered rows");
    }
  }));
}

CPKIT_TEST_AT_CP_SIZES(GatherTokensTest, BackwardSumsEveryRanksGradientOntoTheOwner, 1, 2, 3, 4) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    const int64_t n = 4;
    for (auto dtype : {at::kFloat, at::kDouble}) {
      at::Tensor value = rank_value(rank, n, dtype).requires_grad_(true);
      const at::Tensor gathered = gather_tokens(value, mesh, /*differentiable=*/true);
      require(gathered.requires_grad(), "differentiable gather keeps the graph");
      // Upstream weighted by (rank + 1): a mean or a narrow instead of the sum is caught.
      auto upstream = [&](int r) {
        at::manual_seed(2000 + r);
        return at::randn(gathered.sizes(), gathered.options()) * static_cast<double>(r + 1);
      };
      (gathered * upstream(rank)).sum().backward();
      at::Tensor expected = at::zeros_like(value);
      for (int q = 0; q < world; ++q) expected += upstream(q).narrow(0, rank * n, n);
      require_close(value.grad(), expected, 1e-6, 1e-6, "owner gradient");
    }
  }));
}

// Along any dim (an attention layer's [B, H, S, D] keys gather along S): the concatenation
// of every rank's tensor along that dim in rank order; the backward sums every rank's
// upstream slice of this rank's tokens; negative dims count from the end.
CPKIT_TEST_AT_CP_SIZES(GatherTokensTest, AlongAnyDimIsConcatenationAndItsBackwardSums, 1, 2, 3, 4) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    const int64_t n = 3;
    auto value_of = [](int r) {  // [B 2, H 3, S n, D 2], known to every rank
      at::manual_seed(4000 + r);
      return at::randn({2, 3, n, 2});
    };
    auto upstream_of = [&](int r) {
      at::manual_seed(5000 + r);
      return at::randn({2, 3, world * n, 2});
    };
    std::vector<at::Tensor> all;
    for (int r = 0; r < world; ++r) all.push_back(value_of(r));
    for (const int64_t dim : {int64_t{2}, int64_t{-2}}) {
      const at::Tensor value = value_of(rank).requires_grad_(true);
      const at::Tensor gathered = gather_tokens(value, mesh, /*differentiable=*/true, dim);
      require_equal(gathered, at::cat(all, 2), "gathered along dim " + std::to_string(dim));
      const at::Tensor grad = torch::autograd::grad({gathered}, {value}, {upstream_of(rank)})[0];
      at::Tensor expected = at::zeros_like(value);
      for (int q = 0; q < world; ++q) expected += upstream_of(q).narrow(2, rank * n, n);
      require_close(grad, expected, 1e-6, 1e-6, "backward along dim " + std::to_string(dim));
    }
    // dim 1 of a non-contiguous input (a transposed view) and without autograd.
    const at::Tensor t = value_of(rank).transpose(1, 2);
    std::vector<at::Tensor> all_t;
    for (int r = 0; r < world; ++r) all_t.push_back(value_of(r).transpose(1, 2));
    require_equal(gather_tokens(t, mesh, false, 1), at::cat(all_t, 1), "non-contiguous dim 1");
    try {
      gather_tokens(value_of(rank), mesh, false, 4);
    } catch (const Error& e) {
      require(e.argument() == "dim", "argument named");
      require(std::string(e.what()).find("is 4 but value has 4 dimensions") != std::string::npos,
              e.what());
      return;
    }
    throw std::runtime_error("dim 4 of a 4-d tensor did not raise");
  }));
}

// The upstream in the layouts a trainer's dK/dV really have (token axis not outermost in
// memory, a strided slice beside NaN junk, a broadcast): the same owner gradient as its
// contiguous copy gives.
CPKIT_TEST_AT_CP_SIZES(GatherTokensTest, BackwardTakesAnyUpstreamLayout, 1, 2, 3, 4) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [world](int rank, const MeshPtr& mesh) {
    const int64_t n = 3, rows = world * n;
    // Rank r's upstream values (known to every rank): random, or one row broadcast.
    auto upstream = [&](int r, bool expanded) {
      at::manual_seed(3000 + r);
      const at::Tensor u = at::randn({rows, 3, 2});
      return expanded ? u.narrow(0, 0, 1).expand({rows, 3, 2}).contiguous() : u;
    };
    auto lay_out = [&](const at::Tensor& u, int layout) {
      if (layout == 0) return u.permute({1, 2, 0}).contiguous().permute({2, 0, 1});
      if (layout == 1)
        return at::stack({u, at::full_like(u, NAN)}, 3).reshape({rows, 3, 4}).slice(2, 0, 4, 2);
      return u.narrow(0, 0, 1).expand({rows, 3, 2});
    };
    const char* names[] = {"token axis inner", "sliced beside NaN", "expanded"};
    for (int layout = 0; layout < 3; ++layout) {
      const bool expanded = layout == 2;
      const at::Tensor laid_out = lay_out(upstream(rank, expanded), layout);
      require(!laid_out.is_contiguous() && at::equal(laid_out, upstream(rank, expanded)),
              std::string(names[layout]) + ": the upstream holds the intended values");
      const at::Tensor value = rank_value(rank, n, at::kFloat).requires_grad_(true);
      const at::Tensor gathered = gather_tokens(value, mesh, /*differentiable=*/true);
      const at::Tensor grad = torch::autograd::grad({gathered}, {value}, {laid_out})[0];
      at::Tensor expected = at::zeros_like(value);
      for (int q = 0; q < world; ++q) expected += upstream(q, expanded).narrow(0, rank * n, n);
      require_close(grad, expected, 1e-6, 1e-6, std::string(names[layout]) + " upstream");
    }
  }));
}

// Mismatches need at least two ranks.
CPKIT_TEST_AT_CP_SIZES(GatherMismatchTest, DifferentCountsRaiseOnEveryRank, 2, 3, 4) {
  const int world = cp_size_param;
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

CPKIT_TEST_AT_CP_SIZES(GatherMismatchTest, DifferentTrailingShapesRaiseOnEveryRank, 2, 3, 4) {
  const int world = cp_size_param;
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

// With the value checks off a rank checks a (shape, dtype) once per mesh. Every new one is
// still checked after others were seen: ranks that all meet a new count, trailing shape or
// dtype, and disagree on it, raise instead of gathering mismatched bytes.
CPKIT_TEST_AT_CP_SIZES(GatherMismatchTest, NewShapesAndDtypesAreCheckedAfterOthersWereSeen, 2, 3,
                       4) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [](int rank, const MeshPtr& mesh) {
    struct ChecksOff {
      ChecksOff() { set_value_checks(ValueChecks::kNever); }
      ~ChecksOff() { set_value_checks(ValueChecks::kCpuOnly); }
    } checks_off;
    gather_tokens(at::zeros({3, 2}), mesh, false);  // seen: [3, 2] float
    gather_tokens(at::zeros({3, 2}), mesh, false);
    const std::vector<std::pair<std::string, at::Tensor>> cases = {
        {"the token count (dimension 0)", at::zeros({4 + rank, 2})},
        {"dimension 1", at::zeros({3, 4 + rank})},
        {"the dtype", at::zeros({3, 2}, rank == 0 ? at::kHalf : at::kBFloat16)}};
    for (const auto& [what, value] : cases) {
      try {
        gather_tokens(value, mesh, false);
      } catch (const Error& e) {
        require(std::string(e.what()).find(what + " is ") != std::string::npos, e.what());
        continue;
      }
      throw std::runtime_error("no error when the ranks meet " + what + " anew and disagree");
    }
    // The group still works, and the shape seen first is still fine.
    require_equal(
        gather_tokens(at::full({3, 2}, static_cast<double>(rank)), mesh, false).select(1, 0),
        at::arange(mesh->size()).repeat_interleave(3).to(at::kFloat), "after");
  }));
}

TEST(GatherTokensNoMesh, IsIdentity) {
  const at::Tensor v = at::randn({3, 2}).requires_grad_(true);
  EXPECT_TRUE(at::equal(gather_tokens(v, nullptr, true), v));
  EXPECT_FALSE(gather_tokens(v, nullptr, false).requires_grad());
}

}  // namespace
}  // namespace cpkit
