// gather_tokens and its adjoint as torch.ops.cpkit.*: all-gather forward, reduce-scatter
// SUM backward (cpkit/optimized/gather.hpp). Autograd and fake kernels: cpkit/_ops.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpkit/optimized/gather.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

at::Tensor gather_tokens_op(const at::Tensor& value, const std::string& group_name, int64_t dim) {
  return checked([&] {
    return fresh(gather_tokens(value, mesh_for(group_name, value.device()), false, dim), value);
  });
}

at::Tensor reduce_scatter_tokens_op(const at::Tensor& grad, const std::string& group_name,
                                    int64_t dim) {
  return checked([&] {
    return fresh(reduce_scatter_tokens(grad, mesh_for(group_name, grad.device()), dim), grad);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  m.def("gather_tokens(Tensor value, str group_name, int dim=0) -> Tensor");
  m.def("reduce_scatter_tokens(Tensor grad, str group_name, int dim=0) -> Tensor");
}

// The library's functions take CPU and CUDA tensors alike and pick their kernels themselves.
#define CPKIT_REGISTER_KERNELS(KEY)                             \
  TORCH_LIBRARY_IMPL(cpkit, KEY, m) {                           \
    m.impl("gather_tokens", &gather_tokens_op);                 \
    m.impl("reduce_scatter_tokens", &reduce_scatter_tokens_op); \
  }
CPKIT_REGISTER_KERNELS(CPU)
CPKIT_REGISTER_KERNELS(CUDA)

}  // namespace cpkit::python
