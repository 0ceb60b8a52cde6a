// The loss's saved gradient times the upstream gradient of loss.backward(), in place (plain
// C++ header, safe for nvcc). The kernels read the upstream where it lives, so a CUDA
// upstream costs no host synchronisation, and the usual upstream of exactly 1 leaves the
// gradient untouched: no second pass over [T, V] and no second [T, V] buffer.
#pragma once

#include <cstdint>

#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// The one rule for when scaling is skipped.
CPKIT_HOST_DEVICE inline bool leaves_gradient_as_is(float upstream) { return upstream == 1.0f; }

// grad[0, n) *= *upstream unless leaves_gradient_as_is(*upstream).
void scale_by_upstream_cpu(float* grad, std::int64_t n, const float* upstream);
// Enqueues on `stream` (a cudaStream_t); `upstream` is device memory. CUDA builds only.
void scale_by_upstream_cuda(float* grad, std::int64_t n, const float* upstream, void* stream);

}  // namespace cpkit::kernels
