// CUDA kernel of the fused shifted cross-entropy: one block per row, an online softmax over
// float4 loads, a block-wide merge, then one more pass that writes the gradient.
#include <cuda_runtime.h>

#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace cpkit::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ OnlineSoftmax warp_merge(OnlineSoftmax s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    OnlineSoftmax other{__shfl_down_sync(0xffffffffu, s.max, offset),
                        __shfl_down_sync(0xffffffffu, s.sum, offset)};
    s = online_merge(s, other);
  }
  return s;
}

__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(CrossEntropyArgs a) {
  const std::int64_t row = blockIdx.x;
  const float* z = a.logits + row * a.vocab;
  float* g = a.grad + row * a.vocab;
  const std::int64_t target = a.targets[row];
  const bool vectorised = a.vocab % 4 == 0;  // rows then stay 16-byte aligned
  if (row == 0 && threadIdx.x == 0) *a.scale = loss_scale(a.cp, *a.count);
  if (target == kIgnoreLabel) {
    for (std::int64_t i = threadIdx.x; i < a.vocab; i += kThreads) g[i] = 0.0f;
    if (threadIdx.x == 0) a.row_loss[row] = 0.0f;
    return;
  }
  // Read before the gradient pass: g may be z itself (an in-place call).
  const float target_z = threadIdx.x == 0 ? z[target] : 0.0f;
  OnlineSoftmax s = online_empty();
  if (vectorised) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (std::int64_t i = threadIdx.x; i < a.vocab / 4; i += kThreads) {
      const float4 v = z4[i];
      online_add(s, capped(v.x, a.softcap));
      online_add(s, capped(v.y, a.softcap));
      online_add(s, capped(v.z, a.softcap));
      online_add(s, capped(v.w, a.softcap));
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < a.vocab; i += kThreads)
      online_add(s, capped(z[i], a.softcap));
  }
  __shared__ float maxes[kWarps], sums[kWarps];
  __shared__ OnlineSoftmax row_stats;
  s = warp_merge(s);
  if (threadIdx.x % 32 == 0) {
    maxes[threadIdx.x / 32] = s.max;
    sums[threadIdx.x / 32] = s.sum;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    OnlineSoftmax w = threadIdx.x < kWarps ? OnlineSoftmax{maxes[threadIdx.x], sums[threadIdx.x]}
                                           : online_empty();
    w = warp_merge(w);
    if (threadIdx.x == 0) row_stats = w;
  }
  __syncthreads();
  const OnlineSoftmax stats = row_stats;
  const float row_max = stats.max, ls = log_sum(stats);
  const float scale = loss_scale(a.cp, *a.count);
  if (vectorised) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    float4* g4 = reinterpret_cast<float4*>(g);
    for (std::int64_t i = threadIdx.x; i < a.vocab / 4; i += kThreads) {
      const float4 v = z4[i];
      const std::int64_t k = 4 * i;
      g4[i] = make_float4(cross_entropy_grad(v.x, k == target, row_max, ls, a.softcap, scale),
                          cross_entropy_grad(v.y, k + 1 == target, row_max, ls, a.softcap, scale),
                          cross_entropy_grad(v.z, k + 2 == target, row_max, ls, a.softcap, scale),
                          cross_entropy_grad(v.w, k + 3 == target, row_max, ls, a.softcap, scale));
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < a.vocab; i += kThreads)
      g[i] = cross_entropy_grad(z[i], i == target, row_max, ls, a.softcap, scale);
  }
  if (threadIdx.x == 0) a.row_loss[row] = cross_entropy_value(capped(target_z, a.softcap), stats);
}

}  // namespace

void cross_entropy_cuda(const CrossEntropyArgs& args, void* stream) {
  if (args.rows == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(args.rows), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(args);
}

}  // namespace cpkit::kernels
