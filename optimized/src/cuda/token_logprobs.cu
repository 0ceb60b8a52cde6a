// CUDA kernels of token_logprobs: one block per row. The forward merges each thread's online
// statistics over the block and writes the row's values and saved statistics; the backward
// writes the row's gradient from them (in place when grad == logits).
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/targets.hpp"
#include "kernels/token_logprobs.hpp"
#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ LogprobStats warp_merge(LogprobStats s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const LogprobStats other{__shfl_down_sync(0xffffffffu, s.max, offset),
                             __shfl_down_sync(0xffffffffu, s.sum, offset),
                             __shfl_down_sync(0xffffffffu, s.centred, offset)};
    s = logprob_merge(s, other);
  }
  return s;
}

// The block's statistics, merged over its warps; every thread gets them.
__device__ LogprobStats block_merge(LogprobStats s) {
  __shared__ LogprobStats warps[kWarps];
  __shared__ LogprobStats merged;
  s = warp_merge(s);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    LogprobStats w = threadIdx.x < kWarps ? warps[threadIdx.x] : logprob_empty();
    w = warp_merge(w);
    if (threadIdx.x == 0) merged = w;
  }
  __syncthreads();
  return merged;
}

template <bool kCapped>
__global__ void __launch_bounds__(kThreads) forward_kernel(TokenLogprobsArgs a) {
  const std::int64_t row = blockIdx.x;
  const float* y = a.logits + row * a.vocab;
  const std::int64_t target = a.targets[row];
  float* saved = a.stats + 3 * row;
  if (!reads_target(target, a.vocab)) {
    if (threadIdx.x == 0) {
      const float value = without_target(target);
      a.logprobs[row] = value;
      if (a.entropy) a.entropy[row] = value;
      saved[0] = saved[1] = saved[2] = value;
    }
    return;
  }
  LogprobStats s = logprob_empty();
  for (std::int64_t k = threadIdx.x; k < a.vocab; k += kThreads)
    logprob_add(s, tempered<kCapped>(y[k], a.softcap, a.inv_temperature));
  const RowStats r = row_stats(block_merge(s));
  if (threadIdx.x == 0) {
    a.logprobs[row] = logprob_value(tempered<kCapped>(y[target], a.softcap, a.inv_temperature), r);
    if (a.entropy) a.entropy[row] = entropy_value(r);
    saved[0] = r.max;
    saved[1] = r.log_sum;
    saved[2] = r.mean_centred;
  }
}

template <bool kCapped>
__global__ void __launch_bounds__(kThreads) backward_kernel(TokenLogprobsArgs a) {
  const std::int64_t row = blockIdx.x;
  const float* y = a.logits + row * a.vocab;
  float* g = a.grad + row * a.vocab;
  const std::int64_t target = a.targets[row];
  if (!reads_target(target, a.vocab)) {
    const float value = without_target(target);
    for (std::int64_t k = threadIdx.x; k < a.vocab; k += kThreads) g[k] = value;
    return;
  }
  const float* saved = a.stats + 3 * row;
  const RowStats r{saved[0], saved[1], saved[2]};
  const float g_lp = a.grad_logprobs ? a.grad_logprobs[row] : 0.0f;
  const float g_ent = a.grad_entropy ? a.grad_entropy[row] : 0.0f;
  // Each element is read and written by the same thread: in place is safe.
  for (std::int64_t k = threadIdx.x; k < a.vocab; k += kThreads)
    g[k] = logprob_grad<kCapped>(y[k], k == target, r, g_lp, g_ent, a.softcap, a.inv_temperature);
}

}  // namespace

void token_logprobs_forward_cuda(const TokenLogprobsArgs& args, void* stream) {
  if (args.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(args.rows);
  if (args.softcap > 0.0f)
    checked_launch("token_logprobs forward_kernel<capped>",
                   [&] { forward_kernel<true><<<blocks, kThreads, 0, s>>>(args); });
  else
    checked_launch("token_logprobs forward_kernel",
                   [&] { forward_kernel<false><<<blocks, kThreads, 0, s>>>(args); });
}

void token_logprobs_backward_cuda(const TokenLogprobsArgs& args, void* stream) {
  if (args.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(args.rows);
  if (args.softcap > 0.0f)
    checked_launch("token_logprobs backward_kernel<capped>",
                   [&] { backward_kernel<true><<<blocks, kThreads, 0, s>>>(args); });
  else
    checked_launch("token_logprobs backward_kernel",
                   [&] { backward_kernel<false><<<blocks, kThreads, 0, s>>>(args); });
}

}  // namespace cpkit::kernels
