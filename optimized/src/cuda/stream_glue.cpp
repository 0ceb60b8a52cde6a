// Built with CUDA kernels and a CUDA LibTorch: hands kernels PyTorch's current stream so they
// order with the surrounding ATen work without a host synchronisation.
#include <c10/cuda/CUDAStream.h>

#include "cuda_glue.hpp"

namespace cpkit::detail {

void* current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace cpkit::detail
