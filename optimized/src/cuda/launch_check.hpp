// Every kernel launch is checked (CUDA-only internal header): a bad configuration or a device
// error surfaces as an exception naming the kernel, never as silently missing results.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace cpkit::kernels {

// A CUDA runtime call on the launch path (an attribute, cudaLaunchKernelEx).
inline void check_cuda(cudaError_t error, const std::string& what) {
  if (error != cudaSuccess)
    throw std::runtime_error("cpkit: " + what + " failed: " + cudaGetErrorString(error));
}

inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), std::string("launching the CUDA kernel ") + kernel);
}

}  // namespace cpkit::kernels
