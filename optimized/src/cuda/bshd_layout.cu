// CUDA kernel of a BSHD shard's token streams: one thread per token, the same bshd_token
// body as the CPU loop, all five streams in one launch.
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/bshd_layout.hpp"

namespace cpkit::kernels {

namespace {

__global__ void bshd_layout_kernel(BshdLayoutArgs a) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.rows * a.count) return;
  bshd_token(a, i / a.count, i % a.count);
}

}  // namespace

void bshd_layout_cuda(const BshdLayoutArgs& args, void* stream) {
  const std::int64_t tokens = args.rows * args.count;
  if (tokens == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((tokens + kThreads - 1) / kThreads);
  checked_launch("bshd_layout_kernel", [&] {
    bshd_layout_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  });
}

}  // namespace cpkit::kernels
