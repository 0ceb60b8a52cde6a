// gather_tokens: all-gather forward, one reduce-scatter SUM backward.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "agreement.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/validation.hpp"
#include "fault_injection.hpp"
#include "host_cache_internal.hpp"
#include "mesh_capsule.hpp"
#include "plan_index_cache.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

constexpr int64_t kMaxDims = 8;

// Every rank publishes its shape, dtype and gather dim; all compare the same table, so all
// raise the same error instead of entering a collective with mismatched sizes (a hang),
// mismatched dtypes (garbage) or concatenating along different dims. The exchange runs on
// every call; the table is read on the host per agreement_needs_reading (docs/spec.md
// sections 4 and 6a).
void check_shapes_agree(const at::Tensor& value, int64_t dim, const MeshPtr& mesh) {
  if (value.dim() > kMaxDims)
    raise("value", "has ", value.dim(), " dimensions, at most ", kMaxDims, " are supported");
  static const char* const kSizeNames[kMaxDims] = {"the token count (dimension 0)",
                                                   "dimension 1",
                                                   "dimension 2",
                                                   "dimension 3",
                                                   "dimension 4",
                                                   "dimension 5",
                                                   "dimension 6",
                                                   "dimension 7"};
  std::vector<detail::Agreed> fields{{"value", "the number of dimensions", value.dim()}};
  for (int64_t d = 0; d < kMaxDims; ++d)
    fields.push_back({"value", kSizeNames[d], d < value.dim() ? value.size(d) : -1});
  fields.push_back({"value", "the dtype", detail::dtype_code(value), detail::dtype_name});
  fields.push_back({"dim", "the gather dim", dim});
  std::vector<int64_t> key = value.sizes().vec();
  key.push_back(detail::dtype_code(value));
  key.push_back(dim);
  const bool read = detail::agreement_needs_reading(value, mesh, key);
  detail::exchange_agreed(at::empty({0}, value.options().dtype(at::kLong)), fields, *mesh, read,
                          "every CP rank must gather the same shape and dtype along one dim");
}

// `dim` of a tensor with `ndim` dimensions (negative counts from the end).
int64_t checked_dim(int64_t dim, int64_t ndim, const char* argument) {
  if (dim < -ndim || dim >= ndim)
    raise("dim", "is ", dim, " but ", argument, " has ", ndim, " dimensions (valid: [", -ndim, ", ",
          ndim, "))");
  return dim < 0 ? dim + ndim : dim;
}

// Every rank's contiguous block in rank order ([CP, ...], no copy of a contiguous input),
// then rank-major along `dim`: a view for dim 0, one copy otherwise.
at::Tensor all_gather_along(const at::Tensor& value, int64_t dim, Communicator& comm) {
  const at::Tensor in = value.contiguous();
  std::vector<int64_t> blocks = in.sizes().vec();
  blocks.insert(blocks.begin(), comm.size());
  at::Tensor out = detail::empty_reusable(blocks, in.options());
  // An all-gather moves bytes: every dtype travels as its bytes (float64, int32, float8, ...).
  comm.all_gather(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(in.nbytes()),
                  ScalarKind::kUInt8);
  return out.movedim(0, dim).flatten(dim, dim + 1);
}

class GatherTokens : public torch::autograd::Function<GatherTokens> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& value,
                            const MeshPtr& mesh, int64_t dim) {
    ctx->saved_data["mesh"] = detail::mesh_capsule(mesh);
    ctx->saved_data["dim"] = dim;
    return all_gather_along(value, dim, *mesh);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const MeshPtr mesh = detail::mesh_from_capsule(ctx->saved_data["mesh"]);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {reduce_scatter_tokens(grads[0], mesh, dim), at::Tensor(),
            at::Tensor()};  // no gradient for the mesh or dim
  }
};

}  // namespace

at::Tensor reduce_scatter_tokens(const at::Tensor& grad_output, const MeshPtr& mesh, int64_t dim) {
  detail::require_defined(grad_output, "grad_output");
  if (grad_output.dim() < 1) raise("grad_output", "needs a token axis, got a 0-d tensor");
  dim = checked_dim(dim, grad_output.dim(), "grad_output");
  const int cp = cp_size(mesh);
  if (grad_output.size(dim) % cp != 0)
    raise("grad_output", "has ", grad_output.size(dim), " tokens along dim ", dim,
          ", not a multiple of CP = ", cp);
  if (cp == 1) return grad_output;
  const int64_t n = grad_output.size(dim) / cp;
  if (detail::fault("gather_backward_narrow"))  // own slice of own gradient only
    return grad_output.narrow(dim, mesh->rank() * n, n).clone();
  // Rank-major blocks [CP, ..., N, ...] in memory (a transposed dK/dV is common).
  const at::Tensor grad = grad_output.unflatten(dim, {cp, n}).movedim(dim, 0).contiguous();
  std::vector<int64_t> sizes = grad.sizes().vec();
  sizes.erase(sizes.begin());
  at::Tensor out = detail::empty_reusable(sizes, grad.options());
  mesh->reduce_scatter_sum(grad.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out.numel()),
                           detail::scalar_kind(grad, "grad_output"));
  if (detail::fault("gather_backward_average")) out /= cp;
  return out;
}

at::Tensor gather_tokens(const at::Tensor& value, const MeshPtr& mesh, bool differentiable,
                         int64_t dim) {
  detail::require_defined(value, "value");
  if (value.dim() < 1) raise("value", "needs a token axis, got a 0-d tensor");
  dim = checked_dim(dim, value.dim(), "value");
  if (cp_size(mesh) > 1) check_shapes_agree(value, dim, mesh);
  // The backward reduce-scatters: a dtype the collectives cannot sum raises on every rank
  // alike (the dtype is agreed), before any payload moves.
  if (differentiable && value.requires_grad()) detail::scalar_kind(value, "value");
  if (cp_size(mesh) == 1) return differentiable ? value : value.detach();
  if (differentiable) return GatherTokens::apply(value, mesh, dim);
  return all_gather_along(value.detach(), dim, *mesh);
}

at::Tensor restore_order(const at::Tensor& local, const Layout& layout, const MeshPtr& mesh) {
  detail::require_defined(local, "local");
  if (!layout.plan) raise("layout", "has no plan");
  const LayoutPlan& plan = *layout.plan;
  if (plan.cp_size != cp_size(mesh))
    raise("layout", "was planned for CP = ", plan.cp_size, " but the mesh has ", cp_size(mesh),
          " ranks");
  check_restore_input(local, plan);
  const at::Tensor gathered = gather_tokens(local, mesh, true, 1);
  return gathered.index_select(1, restore_index_tensor(plan, local.device()));
}

at::Tensor restore_index_tensor(const LayoutPlan& plan, const at::Device& device) {
  return detail::cached_plan_index(plan, -1, "restore_order's permutation", device,
                                   [&] { return restore_index(plan); });
}

void check_restore_input(const at::Tensor& local, const LayoutPlan& plan) {
  detail::require_defined(local, "local");
  if (local.dim() < 2 || local.size(1) != plan.local_len)
    raise("local", "has shape ", detail::shape_of(local), " but [rows, ", plan.local_len,
          ", ...] is required");
}

}  // namespace cpkit
