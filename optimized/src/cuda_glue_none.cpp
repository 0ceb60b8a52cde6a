// Built without CUDA kernels: CUDA tensors are rejected with a clear error, and the kernels'
// CUDA launchers are stubs so that callers need no #if (launch_on raises before them).
#include "comm/store_meshes.hpp"
#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"
#include "kernels/agreed_row.hpp"
#include "kernels/attention_launch.hpp"
#include "kernels/bshd_layout.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/packed_layout_launch.hpp"
#include "kernels/token_logprobs_launch.hpp"
#include "kernels/upstream_scale.hpp"

namespace cpkit {
namespace {

[[noreturn]] void no_cuda_kernels(const char* launcher) {
  raise("tensor", launcher, " is a CUDA launcher but cpkit was built without its CUDA kernels");
}

}  // namespace

namespace kernels {

void cross_entropy_cuda(const CrossEntropyArgs&, void*) { no_cuda_kernels("cross_entropy_cuda"); }
void packed_layout_cuda(const PackedLayoutArgs&, void*) { no_cuda_kernels("packed_layout_cuda"); }
void bshd_layout_cuda(const BshdLayoutArgs&, void*) { no_cuda_kernels("bshd_layout_cuda"); }
void token_logprobs_forward_cuda(const TokenLogprobsArgs&, void*) {
  no_cuda_kernels("token_logprobs_forward_cuda");
}
void token_logprobs_backward_cuda(const TokenLogprobsArgs&, void*) {
  no_cuda_kernels("token_logprobs_backward_cuda");
}
void scale_by_upstream_cuda(float*, std::int64_t, const float*, void*) {
  no_cuda_kernels("scale_by_upstream_cuda");
}
void attention_forward_cuda(const AttentionArgs&, void*) {
  no_cuda_kernels("attention_forward_cuda");
}
void attention_backward_cuda(const AttentionArgs&, void*) {
  no_cuda_kernels("attention_backward_cuda");
}
void write_agreed_row_cuda(std::int64_t*, const AgreedRow&, void*) {
  no_cuda_kernels("write_agreed_row_cuda");
}

}  // namespace kernels

namespace detail {

void* current_stream(const at::Tensor& t) {
  raise("tensor", "is on ", t.device(),
        " but cpkit was built without its CUDA kernels (no nvcc or no CUDA LibTorch)");
}

bool cuda_kernels_built() { return false; }

MeshPtr nccl_mesh_over_store(const c10::intrusive_ptr<c10d::Store>&, int, int, int device,
                             std::chrono::milliseconds) {
  raise("device", "is cuda:", device,
        " but cpkit was built without CUDA and NCCL: CUDA meshes are not available");
}

// No CUDA runtime here: CUDA tensors (a CUDA LibTorch) take the caller's ATen copy.
bool copy_rows_2d(const at::Tensor&, const at::Tensor&) { return false; }

// No CUDA kernels (and so no graph capture to guard against): a plain copy.
at::Tensor upload(const at::Tensor& host, const at::Device& device, const char*) {
  return host.to(device);
}

}  // namespace detail
}  // namespace cpkit
