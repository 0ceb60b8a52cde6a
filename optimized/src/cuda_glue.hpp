// What the LibTorch-side code needs from CUDA, without CUDA headers (internal header).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

namespace cpkit::detail {

// The current PyTorch CUDA stream of `t`'s device, as a cudaStream_t. Raises without CUDA.
void* current_stream(const at::Tensor& t);

// Whether this build has cpkit's CUDA kernels. Without them the kernels' *_cuda launchers
// are stubs (cuda_glue_none.cpp) that launch_on never reaches; with them, cuda_glue_cuda.cpp
// implements this header.
bool cuda_kernels_built();

// The one way LibTorch-side code launches a kernel: `launch(stream)` with `t`'s GPU current
// and its current PyTorch stream. Built without the CUDA kernels, it raises naming the device.
template <class Launch>
void launch_on(const at::Tensor& t, Launch&& launch) {
  const c10::DeviceGuard on_device(t.device());
  launch(current_stream(t));
}

// dst.copy_(src) for CUDA tensors [B, n, ...] whose batch rows are each contiguous (any row
// pitch): one cudaMemcpy2DAsync on the current stream instead of a strided copy kernel.
// Returns false, copying nothing, when the layouts do not allow it.
bool copy_rows_2d(const at::Tensor& dst, const at::Tensor& src);

// `host` (CPU) on `device` without blocking the host: one copy from pinned memory. Raises,
// naming `what`, inside CUDA-graph capture: the copy would be replayed from a host buffer
// that is reused by then, i.e. with stale values.
at::Tensor upload(const at::Tensor& host, const at::Device& device, const char* what);

}  // namespace cpkit::detail
