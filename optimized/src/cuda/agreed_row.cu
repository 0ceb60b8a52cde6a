// CUDA kernel writing an agreement row from its by-value argument (kernels/agreed_row.hpp).
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/agreed_row.hpp"

namespace cpkit::kernels {

namespace {

__global__ void write_agreed_row_kernel(std::int64_t* dst, AgreedRow row) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < row.count) dst[i] = row.values[i];
}

}  // namespace

void write_agreed_row_cuda(std::int64_t* dst, const AgreedRow& row, void* stream) {
  if (row.count == 0) return;
  checked_launch("write_agreed_row_kernel", [&] {
    write_agreed_row_kernel<<<1, kMaxAgreedValues, 0, static_cast<cudaStream_t>(stream)>>>(dst,
                                                                                           row);
  });
}

}  // namespace cpkit::kernels
