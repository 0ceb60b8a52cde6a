// CUDA kernel for a shard's packed-document metadata: one thread per token, the same
// packed_token body as the CPU loop.
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/packed_layout.hpp"
#include "kernels/packed_layout_launch.hpp"

namespace cpkit::kernels {

namespace {

__global__ void packed_layout_kernel(PackedLayoutArgs a) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.count) return;
  const PackedToken tok = packed_token(a.begin + j, a.cu_padded, a.lens, a.docs);
  a.document[j] = tok.document;
  a.position[j] = tok.position;
  a.padding[j] = tok.padding;
}

}  // namespace

void packed_layout_cuda(const PackedLayoutArgs& args, void* stream) {
  if (args.count == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((args.count + kThreads - 1) / kThreads);
  checked_launch("packed_layout_kernel", [&] {
    packed_layout_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  });
}

}  // namespace cpkit::kernels
