// docs/spec.md section 4 on the optimized path in real rank processes: gather_tokens forward and
// its reduce-scatter backward against the reference, for contiguous, transposed, sliced and
// expanded inputs and upstream gradients; mismatched counts raise on every rank.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <sstream>

#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/gather.hpp"
#include "generators.hpp"
#include "layouts.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

struct GatherCase {
  int cp = 1;
  int tokens = 0;
  int features = 1;
  MemoryLayout value_layout = MemoryLayout::kContiguous;
  MemoryLayout grad_layout = MemoryLayout::kContiguous;
  std::uint64_t seed = 0;
};

std::string encode(const GatherCase& c) {
  std::ostringstream os;
  os << c.cp << " " << c.tokens << " " << c.features << " " << static_cast<int>(c.value_layout)
     << " " << static_cast<int>(c.grad_layout) << " " << c.seed;
  return os.str();
}

GatherCase decode_gather(const std::string& text) {
  std::istringstream in(text);
  GatherCase c;
  int value_layout = 0, grad_layout = 0;
  in >> c.cp >> c.tokens >> c.features >> value_layout >> grad_layout >> c.seed;
  c.value_layout = static_cast<MemoryLayout>(value_layout);
  c.grad_layout = static_cast<MemoryLayout>(grad_layout);
  return c;
}

// Rank r's input, and the upstream gradient rank r's gathered output receives (scaled by
// r + 1 so that a backward which averages or narrows is visible).
reference::FloatMatrix value_of(const GatherCase& c, int r) {
  return layout_values(c.tokens, c.features, c.value_layout,
                       input_seed(c.seed, Input::kGatherValue, r));
}

reference::FloatMatrix upstream_of(const GatherCase& c, int r) {
  return layout_values(c.cp * c.tokens, c.features, c.grad_layout,
                       input_seed(c.seed, Input::kGatherGrad, r)) *
         static_cast<float>(r + 1);
}

const RankTask gather("gather", [](const std::string& p, const MeshPtr& mesh, int rank) {
  const GatherCase c = decode_gather(p);
  const at::Tensor value =
      lay_out(to_tensor(value_of(c, rank)), c.value_layout, NAN).detach().requires_grad_(true);
  const at::Tensor gathered = gather_tokens(value, mesh, true);
  const at::Tensor upstream = lay_out(to_tensor(upstream_of(c, rank)), c.grad_layout, NAN);
  const auto grad = torch::autograd::grad({gathered}, {value}, {upstream});
  pool::Bundle out;
  out.add("gathered", gathered);
  out.add("grad", grad[0]);
  return out.serialise();
});

const RankTask gather_mismatch("gather_mismatch", [](const std::string&, const MeshPtr& mesh,
                                                     int rank) {
  gather_tokens(at::zeros({rank + 1, 2}), mesh, true);  // must raise on every rank
  return std::string("no error");
});

void check_gather(const GatherCase& c) {
  RC_TAG(layout_name(c.value_layout), layout_name(c.grad_layout));
  const auto bundles = gather.run(c.cp, encode(c));
  std::vector<reference::FloatMatrix> values, upstream;
  for (int r = 0; r < c.cp; ++r) {
    values.push_back(value_of(c, r));
    upstream.push_back(upstream_of(c, r));
  }
  const at::Tensor gathered = to_tensor(reference::gather_tokens(values));
  const auto grads = reference::gather_tokens_backward(upstream);
  for (int r = 0; r < c.cp; ++r) {
    require_same(bundles[r].get("gathered"), gathered, "gathered on rank " + std::to_string(r));
    // Float sums in a different order: a few ulp of the largest term.
    require_near(bundles[r].get("grad"), to_tensor(grads[r]), kGatherGradAtol * c.cp,
                 kGatherGradRtol, "owner gradient on rank " + std::to_string(r));
  }
}

// Failure class: gather backward that averages or narrows instead of summing, or reads a
// non-contiguous gradient as if it were contiguous.
RC_GTEST_PROP(OptimizedGather, BackwardSumsRankWeightedSlices, ()) {
  GatherCase c;
  c.cp = *rc::gen::inRange(1, 9);
  c.tokens = *rc::gen::inRange(0, 6);
  c.features = *rc::gen::inRange(1, 5);
  c.value_layout = *gen_memory_layout();
  c.grad_layout = *gen_memory_layout();
  c.seed = *rc::gen::arbitrary<std::uint64_t>();
  check_gather(c);
}

RC_GTEST_PROP(OptimizedGather, MismatchedCountsRaiseOnEveryRank, ()) {
  const int cp = *rc::gen::inRange(2, 9);
  const auto replies = gather_mismatch.replies(cp, "");
  for (int r = 0; r < cp; ++r) {
    RC_ASSERT(!replies[r].ok);
    RC_ASSERT(replies[r].bytes.find("argument 'value'") != std::string::npos);
  }
}

}  // namespace
}  // namespace cpkit::harness
