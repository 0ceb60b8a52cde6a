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

}  // namespace cpkit::detail
