// Which layout plan a shard's labels and valid were cut with (internal header, docs/spec.md
// section 6a). A loss, or token_logprobs, given a shard cut with a non-contiguous layout but
// no plan (or another plan) would read each fragment's next token from the wrong place and
// return a plausible, wrong loss; the shard's own tensors remember their plan, so the op can
// tell and raise, naming `layout`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cpkit/optimized/layout.hpp"

namespace cpkit::detail {

// A 64-bit fingerprint of the plan's contents: 0 for none and for a contiguous plan (the
// same thing to every op), else a hash of its kind, CP, lengths and every rank's fragments.
// Equal plans decoded from the same tensor on every rank have equal fingerprints.
std::int64_t plan_fingerprint(const LayoutPlan* plan);
// A fingerprint in an error message: "contiguous (no plan)" or the plan's hash in hex.
std::string plan_description(std::int64_t fingerprint);

// Remembers that `t` (a shard's labels or valid) was cut with `plan`; nothing for contiguous.
void tie_to_plan(const at::Tensor& t, const std::shared_ptr<const LayoutPlan>& plan);

// Raises naming `layout` when `t` (named `name`) was cut with a plan other than `plan`
// (null: contiguous). Tensors made elsewhere, or copies, carry no tie and always pass.
void check_plan_tie(const at::Tensor& t, const char* name, const LayoutPlan* plan);

}  // namespace cpkit::detail
