// Built without CUDA kernels: CUDA tensors are rejected with a clear error.
#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"

namespace cpkit::detail {

void* current_stream(const at::Tensor& t) {
  raise("tensor", "is on ", t.device(),
        " but cpkit was built without its CUDA kernels (no nvcc or no CUDA LibTorch)");
}

// No CUDA runtime here: CUDA tensors (a CUDA LibTorch) take the caller's ATen copy.
bool copy_rows_2d(const at::Tensor&, const at::Tensor&) { return false; }

// No CUDA kernels (and so no graph capture to guard against): a plain copy.
at::Tensor upload(const at::Tensor& host, const at::Device& device, const char*) {
  return host.to(device);
}

}  // namespace cpkit::detail
