// CUDA kernel of the fused shifted cross-entropy: one block per row, an online softmax over
// float4 loads of the row's aligned middle (any V), a block-wide merge, then one more pass
// that writes the gradient (in place when grad == logits).
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/targets.hpp"

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
  if (row == 0 && threadIdx.x == 0) *a.scale = loss_scale(a.cp, *a.count);
  if (target == kIgnoreLabel || !in_vocabulary(target, a.vocab)) {
    const float value = target == kIgnoreLabel ? 0.0f : NAN;
    for (std::int64_t i = threadIdx.x; i < a.vocab; i += kThreads) g[i] = value;
    if (threadIdx.x == 0) a.row_loss[row] = value;
    return;
  }
  // 16-byte loads over the aligned middle of the row; the gradient is written the same way
  // when its row has the same alignment (always for in-place calls and torch's allocations).
  const VectorSpan span = vector_span(reinterpret_cast<std::uintptr_t>(z), a.vocab);
  const bool same_alignment =
      (reinterpret_cast<std::uintptr_t>(g) - reinterpret_cast<std::uintptr_t>(z)) % 16 == 0;
  const std::int64_t tail_begin = span.head + 4 * span.quads;
  const float4* z4 = reinterpret_cast<const float4*>(z + span.head);
  // Read before the gradient pass: g may be z itself (an in-place call).
  const float target_z = threadIdx.x == 0 ? z[target] : 0.0f;
  OnlineSoftmax s = online_empty();
  for (std::int64_t i = threadIdx.x; i < span.quads; i += kThreads) {
    const float4 v = z4[i];
    online_add(s, capped(v.x, a.softcap));
    online_add(s, capped(v.y, a.softcap));
    online_add(s, capped(v.z, a.softcap));
    online_add(s, capped(v.w, a.softcap));
  }
  for (std::int64_t i = threadIdx.x; i < span.head + span.tail; i += kThreads)
    online_add(s, capped(z[i < span.head ? i : tail_begin + i - span.head], a.softcap));
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
  auto grad_at = [&](float v, std::int64_t k) {
    return cross_entropy_grad(v, k == target, row_max, ls, a.softcap, scale);
  };
  if (same_alignment) {
    float4* g4 = reinterpret_cast<float4*>(g + span.head);
    for (std::int64_t i = threadIdx.x; i < span.quads; i += kThreads) {
      const float4 v = z4[i];
      const std::int64_t k = span.head + 4 * i;
      g4[i] = make_float4(grad_at(v.x, k), grad_at(v.y, k + 1), grad_at(v.z, k + 2),
                          grad_at(v.w, k + 3));
    }
    for (std::int64_t i = threadIdx.x; i < span.head + span.tail; i += kThreads) {
      const std::int64_t k = i < span.head ? i : tail_begin + i - span.head;
      g[k] = grad_at(z[k], k);
    }
  } else {
    for (std::int64_t k = threadIdx.x; k < a.vocab; k += kThreads) g[k] = grad_at(z[k], k);
  }
  if (threadIdx.x == 0) a.row_loss[row] = cross_entropy_value(capped(target_z, a.softcap), stats);
}

}  // namespace

void cross_entropy_cuda(const CrossEntropyArgs& args, void* stream) {
  if (args.rows == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(args.rows), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(args);
  check_launch("cross_entropy_kernel");
}

}  // namespace cpkit::kernels
