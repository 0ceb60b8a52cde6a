// docs/spec.md section 4 for the reference: gather_tokens forward order and its reduce-scatter SUM.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

struct GatherCase {
  int cp, tokens, features;
  std::uint64_t seed;
};

rc::Gen<GatherCase> gen_gather_case() {
  return rc::gen::exec([] {
    return GatherCase{*rc::gen::inRange(1, 9), *rc::gen::inRange(0, 7), *rc::gen::inRange(1, 5),
                      *rc::gen::arbitrary<std::uint64_t>()};
  });
}

RC_GTEST_PROP(ReferenceGather, ForwardConcatenatesInRankOrder, ()) {
  const GatherCase c = *gen_gather_case();
  std::vector<FloatMatrix> local;
  for (int r = 0; r < c.cp; ++r)
    local.push_back(
        random_floats(c.tokens, c.features, 1, input_seed(c.seed, Input::kGatherValue, r)));
  const FloatMatrix gathered = gather_tokens(local);
  RC_ASSERT(gathered.rows() == c.cp * c.tokens);
  for (int r = 0; r < c.cp; ++r)
    for (int i = 0; i < c.tokens; ++i) RC_ASSERT(gathered.row(r * c.tokens + i) == local[r].row(i));
}

RC_GTEST_PROP(ReferenceGather, BackwardSumsEveryRanksSlice, ()) {
  const GatherCase c = *gen_gather_case();
  // Upstream of rank q is weighted by (q + 1): averaging, narrowing or summing the wrong
  // slice gives a different answer than the true sum.
  std::vector<FloatMatrix> upstream;
  for (int q = 0; q < c.cp; ++q)
    upstream.push_back(
        random_floats(c.cp * c.tokens, c.features, 1, input_seed(c.seed, Input::kGatherGrad, q)) *
        static_cast<float>(q + 1));
  const std::vector<FloatMatrix> grads = gather_tokens_backward(upstream);
  RC_ASSERT(static_cast<int>(grads.size()) == c.cp);
  for (int r = 0; r < c.cp; ++r) {
    RC_ASSERT(grads[r].rows() == c.tokens);
    for (int i = 0; i < c.tokens; ++i)
      for (int f = 0; f < c.features; ++f) {
        double expected = 0;  // d/dx_r[i, f] of sum_q <upstream_q, gathered>
        for (int q = 0; q < c.cp; ++q) expected += upstream[q](r * c.tokens + i, f);
        RC_ASSERT(std::abs(grads[r](i, f) - expected) <= 1e-5 * (1 + std::abs(expected)));
      }
  }
}

}  // namespace
}  // namespace cpkit::harness
