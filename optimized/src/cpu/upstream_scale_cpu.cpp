// CPU twin of the in-place upstream scaling (kernels/upstream_scale.hpp).
#include <ATen/Parallel.h>

#include "kernels/upstream_scale.hpp"

namespace cpkit::kernels {

void scale_by_upstream_cpu(float* grad, std::int64_t n, const float* upstream) {
  const float u = *upstream;
  if (leaves_gradient_as_is(u)) return;
  at::parallel_for(0, n, 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) grad[i] *= u;
  });
}

}  // namespace cpkit::kernels
