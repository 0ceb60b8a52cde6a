// Built without CUDA kernels: CUDA tensors are rejected with a clear error.
#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"

namespace cpkit::detail {

void* current_stream(const at::Tensor& t) {
  raise("tensor", "is on ", t.device(),
        " but cpkit was built without its CUDA kernels (no nvcc or no CUDA LibTorch)");
}

}  // namespace cpkit::detail
