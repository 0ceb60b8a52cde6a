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

// Every kernel launch goes through here. cudaGetLastError reports any earlier failed call
// too, so an error pending before the launch is raised as such (not blamed on this kernel);
// then the launch's own error is raised naming the kernel.
template <class Launch>
void checked_launch(const char* kernel, Launch&& launch) {
  const cudaError_t earlier = cudaGetLastError();
  if (earlier != cudaSuccess)
    throw std::runtime_error(std::string("cpkit: an earlier CUDA call failed (seen before "
                                         "launching ") +
                             kernel + "): " + cudaGetErrorString(earlier));
  launch();
  check_cuda(cudaGetLastError(), std::string("launching the CUDA kernel ") + kernel);
}

}  // namespace cpkit::kernels
