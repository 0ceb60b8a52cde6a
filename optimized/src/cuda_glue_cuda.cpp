// Built with CUDA kernels and a CUDA LibTorch: hands kernels PyTorch's current stream so they
// order with the surrounding ATen work without a host synchronisation.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"

namespace cpkit::detail {

void* current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

bool cuda_kernels_built() { return true; }

namespace {

// Each batch row of t (t[b], all but dim 0) is contiguous.
bool rows_contiguous(const at::Tensor& t) { return t.dim() >= 2 && t.select(0, 0).is_contiguous(); }

}  // namespace

bool copy_rows_2d(const at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_cuda() || !src.is_cuda() || dst.device() != src.device() ||
      dst.dtype() != src.dtype() || dst.sizes() != src.sizes())
    return false;
  if (dst.numel() == 0) return true;
  if (!rows_contiguous(dst) || !rows_contiguous(src)) return false;
  const size_t item = dst.element_size();
  const size_t width = static_cast<size_t>(dst.select(0, 0).numel()) * item;
  // A single row has no pitch of its own (its stride may be anything): use its width.
  auto pitch = [&](const at::Tensor& t) {
    return t.size(0) == 1 ? width : static_cast<size_t>(t.stride(0)) * item;
  };
  if (pitch(dst) < width || pitch(src) < width) return false;  // overlapping rows
  const c10::cuda::CUDAGuard on_device(dst.device());
  // cudaMemcpy2D takes pitches below the device's limit (2 GiB on current GPUs): rows of
  // larger batches take ATen's copy instead.
  int max_pitch = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, dst.device().index()));
  const auto limit = static_cast<size_t>(max_pitch);
  if (pitch(dst) > limit || pitch(src) > limit) return false;
  C10_CUDA_CHECK(cudaMemcpy2DAsync(dst.data_ptr(), pitch(dst), src.data_ptr(), pitch(src), width,
                                   static_cast<size_t>(dst.size(0)), cudaMemcpyDeviceToDevice,
                                   c10::cuda::getCurrentCUDAStream(dst.device().index())));
  return true;
}

at::Tensor upload(const at::Tensor& host, const at::Device& device, const char* what) {
  if (device.is_cpu()) return host;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(
      cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone)
    raise("device", what,
          " come from the host and cannot be captured into a CUDA graph (a replay would copy "
          "stale values): compute them before capture begins");
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace cpkit::detail
