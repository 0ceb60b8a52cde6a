// Internal entry to the host buffer cache (cpkit/optimized/host_cache.hpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace cpkit::detail {

// Like at::empty(sizes, options). CPU tensors of at least 1 MiB take their storage from the
// host cache (and give it back when freed); anything else is a plain at::empty.
at::Tensor empty_reusable(at::IntArrayRef sizes, const at::TensorOptions& options);

inline at::Tensor empty_reusable_like(const at::Tensor& t) {
  return empty_reusable(t.sizes(), t.options());
}

}  // namespace cpkit::detail
