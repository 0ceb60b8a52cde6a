// Index tensors derived from a layout plan, built on the host and uploaded to a device once
// per (plan, rank, purpose, device) (internal header). A step's losses and restore_order then
// move no index from the host: no host-to-device copy per call, and a CUDA graph captured after
// a first (warm-up) call replays the cached tensors. Balanced plans change with every batch's
// documents, so the cache keeps the most recently used entries only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "cpkit/optimized/layout.hpp"

namespace cpkit::detail {

// The int64 tensor `build()` returns, on `device`; `build` runs on a miss only. `what` names
// the purpose (one cache key per purpose) and the upload in errors.
at::Tensor cached_plan_index(const LayoutPlan& plan, int rank, const char* what,
                             const at::Device& device,
                             const std::function<std::vector<std::int64_t>()>& build);

// Entries kept (least recently used go first).
constexpr std::size_t kPlanIndexCacheEntries = 256;

}  // namespace cpkit::detail
