// Every kernel launch is checked (CUDA-only internal header): a bad configuration or a device
// error surfaces as an exception naming the kernel, never as silently missing results.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace cpkit::kernels {

inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    throw std::runtime_error(std::string("cpkit: launching the CUDA kernel ") + kernel +
                             " failed: " + cudaGetErrorString(error));
}

// A CUDA runtime call on the launch path (an attribute, cudaLaunchKernelEx).
inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw std::runtime_error(std::string("cpkit: ") + what +
                             " failed: " + cudaGetErrorString(error));
}

}  // namespace cpkit::kernels
