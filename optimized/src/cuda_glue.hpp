// What the LibTorch-side code needs from CUDA, without CUDA headers (internal header).
#pragma once

#include <ATen/core/Tensor.h>

namespace cpkit::detail {

// The current PyTorch CUDA stream of `t`'s device, as a cudaStream_t. Raises without CUDA.
void* current_stream(const at::Tensor& t);

// dst.copy_(src) for CUDA tensors [B, n, ...] whose batch rows are each contiguous (any row
// pitch): one cudaMemcpy2DAsync on the current stream instead of a strided copy kernel.
// Returns false, copying nothing, when the layouts do not allow it.
bool copy_rows_2d(const at::Tensor& dst, const at::Tensor& src);

}  // namespace cpkit::detail
