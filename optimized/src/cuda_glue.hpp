// What the LibTorch-side code needs from CUDA, without CUDA headers (internal header).
#pragma once

#include <ATen/core/Tensor.h>

namespace cpkit::detail {

// The current PyTorch CUDA stream of `t`'s device, as a cudaStream_t. Raises without CUDA.
void* current_stream(const at::Tensor& t);

}  // namespace cpkit::detail
