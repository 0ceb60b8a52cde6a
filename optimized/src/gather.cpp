// gather_tokens: all-gather forward, one reduce-scatter SUM backward.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/validation.hpp"
#include "fault_injection.hpp"
#include "host_cache_internal.hpp"
#include "mesh_capsule.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

constexpr int64_t kMaxDims = 8;

// Every rank publishes its shape; all compare the same table, so all raise the same error
// instead of entering a collective with mismatched sizes and hanging.
void check_shapes_agree(const at::Tensor& value, Communicator& comm) {
  if (value.dim() > kMaxDims)
    raise("value", "has ", value.dim(), " dimensions, at most ", kMaxDims, " are supported");
  const int cp = comm.size();
  std::vector<int64_t> mine(kMaxDims + 1, -1);
  mine[0] = value.dim();
  for (int64_t d = 0; d < value.dim(); ++d) mine[1 + d] = value.size(d);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(value.device());
  at::Tensor local = at::tensor(mine, at::kLong).to(value.device());
  at::Tensor all = at::empty({cp, kMaxDims + 1}, opts);
  comm.all_gather(local.data_ptr(), all.data_ptr(), kMaxDims + 1, ScalarKind::kInt64);
  const at::Tensor table = all.cpu();
  const int64_t* t = table.data_ptr<int64_t>();
  for (int r = 0; r < cp; ++r) {
    const int64_t* other = t + r * (kMaxDims + 1);
    if (other[1] != mine[1])
      raise("value", "rank ", comm.rank(), " holds ", mine[1], " tokens but rank ", r, " holds ",
            other[1]);
    for (int64_t d = 0; d <= kMaxDims; ++d)
      if (other[d] != mine[d])
        raise("value", "rank ", comm.rank(), " has shape ", detail::shape_of(value), " but rank ",
              r, " has a different trailing shape or rank (dimension ", d - 1, ": ", other[d],
              " vs ", mine[d], ")");
  }
}

// Shapes this rank has already checked, per mesh: by the mesh's group name where it has one
// (meshes rebuilt per call share it), else by the mesh's control block, so a destroyed
// mesh's entry can never be taken for a new mesh at the same address.
class VerifiedShapes {
 public:
  using Shape = std::vector<int64_t>;

  // True the first time `shape` is seen on `mesh` (the caller then checks it).
  bool first_sighting(const MeshPtr& mesh, const Shape& shape) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::string group = mesh->group_name();
    if (!group.empty()) return by_group_[group].insert(shape).second;
    std::erase_if(by_mesh_, [](const auto& entry) { return entry.first.expired(); });
    return by_mesh_[mesh].insert(shape).second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::set<Shape>> by_group_;
  std::map<std::weak_ptr<Communicator>, std::set<Shape>, std::owner_less<>> by_mesh_;
};

// Every call for CPU tensors (free) or with ValueChecks::kAlways; once per (mesh, shape and
// dtype) otherwise: the check is a collective and, for CUDA tensors, a host round trip. A
// rank whose shape changes while the others' do not is then caught by the collective's own
// size check or timeout, not here (docs/spec.md section 3).
bool shapes_need_checking(const at::Tensor& value, const MeshPtr& mesh) {
  if (detail::check_values_of(value)) return true;
  static VerifiedShapes verified;
  std::vector<int64_t> key = value.sizes().vec();
  key.push_back(static_cast<int64_t>(value.scalar_type()));
  return verified.first_sighting(mesh, key);
}

at::Tensor all_gather_rows(const at::Tensor& value, Communicator& comm) {
  const at::Tensor in = value.contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] *= comm.size();
  at::Tensor out = detail::empty_reusable(sizes, in.options());
  comm.all_gather(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(in.numel()),
                  detail::scalar_kind(in, "value"));
  return out;
}

class GatherTokens : public torch::autograd::Function<GatherTokens> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& value,
                            const MeshPtr& mesh) {
    ctx->saved_data["mesh"] = detail::mesh_capsule(mesh);
    return all_gather_rows(value, *mesh);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const MeshPtr mesh = detail::mesh_from_capsule(ctx->saved_data["mesh"]);
    return {reduce_scatter_tokens(grads[0], mesh), at::Tensor()};  // no gradient for the mesh
  }
};

}  // namespace

at::Tensor reduce_scatter_tokens(const at::Tensor& grad_output, const MeshPtr& mesh) {
  detail::require_defined(grad_output, "grad_output");
  if (grad_output.dim() < 1) raise("grad_output", "needs a token axis, got a 0-d tensor");
  const int cp = cp_size(mesh);
  if (grad_output.size(0) % cp != 0)
    raise("grad_output", "has ", grad_output.size(0), " rows, not a multiple of CP = ", cp);
  if (cp == 1) return grad_output;
  const at::Tensor grad = grad_output.contiguous();  // a transposed dK/dV is common
  std::vector<int64_t> sizes = grad.sizes().vec();
  sizes[0] /= cp;
  if (detail::fault("gather_backward_narrow"))  // own slice of own gradient only
    return grad.narrow(0, mesh->rank() * sizes[0], sizes[0]).clone();
  at::Tensor out = detail::empty_reusable(sizes, grad.options());
  mesh->reduce_scatter_sum(grad.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out.numel()),
                           detail::scalar_kind(grad, "grad_output"));
  if (detail::fault("gather_backward_average")) out /= cp;
  return out;
}

at::Tensor gather_tokens(const at::Tensor& value, const MeshPtr& mesh, bool differentiable) {
  detail::require_defined(value, "value");
  if (value.dim() < 1) raise("value", "needs a token axis, got a 0-d tensor");
  detail::scalar_kind(value, "value");
  if (cp_size(mesh) == 1) return differentiable ? value : value.detach();
  if (shapes_need_checking(value, mesh)) check_shapes_agree(value, *mesh);
  if (differentiable) return GatherTokens::apply(value, mesh);
  return all_gather_rows(value.detach(), *mesh);
}

at::Tensor restore_order(const at::Tensor& local, const Layout& layout, const MeshPtr& mesh) {
  detail::require_defined(local, "local");
  if (!layout.plan) raise("layout", "has no plan");
  const LayoutPlan& plan = *layout.plan;
  if (plan.cp_size != cp_size(mesh))
    raise("layout", "was planned for CP = ", plan.cp_size, " but the mesh has ", cp_size(mesh),
          " ranks");
  if (local.dim() < 2 || local.size(1) != plan.local_len)
    raise("local", "has shape ", detail::shape_of(local), " but [rows, ", plan.local_len,
          ", ...] is required");
  // Tokens first, so the gather concatenates ranks along the token axis.
  const at::Tensor gathered = gather_tokens(local.transpose(0, 1).contiguous(), mesh, true);
  // Global position g sits at index order[g] of the rank-order concatenation.
  std::vector<int64_t> order(static_cast<std::size_t>(plan.padded_len));
  for (int q = 0; q < plan.cp_size; ++q) {
    const std::vector<int64_t> positions = layout_positions(plan, q);
    for (std::size_t j = 0; j < positions.size(); ++j)
      order[static_cast<std::size_t>(positions[j])] = q * plan.local_len + static_cast<int64_t>(j);
  }
  const at::Tensor index = at::tensor(order, at::kLong).to(local.device());
  return gathered.index_select(0, index).transpose(0, 1);
}

}  // namespace cpkit
