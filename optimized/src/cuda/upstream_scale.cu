// CUDA kernel of the in-place upstream scaling: every thread reads the device-side upstream
// (one cached word) and returns at once when it is exactly 1; otherwise a grid-stride pass
// of 16-byte loads and stores over the aligned middle of the buffer.
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/upstream_scale.hpp"
#include "kernels/vector_span.hpp"

namespace cpkit::kernels {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

__global__ void __launch_bounds__(kThreads)
    scale_by_upstream_kernel(float* grad, std::int64_t n, const float* upstream) {
  const float u = *upstream;
  if (leaves_gradient_as_is(u)) return;
  const VectorSpan span = vector_span(reinterpret_cast<std::uintptr_t>(grad), n);
  float4* middle = reinterpret_cast<float4*>(grad + span.head);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (std::int64_t i = first; i < span.quads; i += stride) {
    float4 v = middle[i];
    v.x *= u;
    v.y *= u;
    v.z *= u;
    v.w *= u;
    middle[i] = v;
  }
  const std::int64_t tail_begin = span.head + 4 * span.quads;
  for (std::int64_t i = first; i < span.head + span.tail; i += stride)
    grad[i < span.head ? i : tail_begin + i - span.head] *= u;
}

}  // namespace

void scale_by_upstream_cuda(float* grad, std::int64_t n, const float* upstream, void* stream) {
  if (n == 0) return;
  const std::int64_t wanted = (n / 4 + kThreads - 1) / kThreads;
  const unsigned blocks = wanted < kMaxBlocks ? static_cast<unsigned>(wanted) + 1 : kMaxBlocks;
  checked_launch("scale_by_upstream_kernel", [&] {
    scale_by_upstream_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(grad, n,
                                                                                         upstream);
  });
}

}  // namespace cpkit::kernels
