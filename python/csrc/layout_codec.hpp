// A microbatch's LayoutPlan as one int64 tensor: how the Python package carries a layout from
// the shard op to the losses, the offsets, the cut and restore_order (a tensor, so a new
// plan each step never recompiles a traced graph).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit::python {

// [kind, cp_size, seq_len, padded_len, local_len, n_0 .. n_{cp-1}, then every rank's
// fragments in rank order as begin, end pairs]; kind 0 contiguous, 1 head_tail, 2 balanced.
at::Tensor plan_to_tensor(const LayoutPlan& plan);

// The inverse; a tensor that is not such a plan raises naming `argument`.
std::shared_ptr<const LayoutPlan> plan_from_tensor(const at::Tensor& t, const char* argument);

// [seq_len, padded_len, local_len, then the rank's fragments as begin, end pairs]: what the
// shard_layout and layout_fragments ops return.
std::vector<std::int64_t> layout_summary(const Layout& layout);

}  // namespace cpkit::python
