// Agreement across the CP group: one table, compared by every rank.
#include "agreement.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"
#include "kernels/agreed_row.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

// Keys this rank has already read, per mesh: by the mesh's group name where it has one
// (meshes rebuilt per call share it), else by the mesh's control block, so a destroyed
// mesh's entry can never be taken for a new mesh at the same address.
class SeenKeys {
 public:
  using Key = std::vector<std::int64_t>;

  bool first_sighting(const MeshPtr& mesh, const Key& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::string group = mesh->group_name();
    if (!group.empty()) return by_group_[group].insert(key).second;
    std::erase_if(by_mesh_, [](const auto& entry) { return entry.first.expired(); });
    return by_mesh_[mesh].insert(key).second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::set<Key>> by_group_;
  std::map<std::weak_ptr<Communicator>, std::set<Key>, std::owner_less<>> by_mesh_;
};

std::string plain(std::int64_t v) { return std::to_string(v); }

}  // namespace

at::Tensor exchange_agreed(const at::Tensor& carried, const std::vector<Agreed>& fields,
                           Communicator& comm, bool read, const char* why) {
  const int64_t k = carried.numel(), width = k + static_cast<int64_t>(fields.size());
  if (fields.size() > static_cast<std::size_t>(kernels::kMaxAgreedValues))
    raise("fields", "an agreement holds at most ", kernels::kMaxAgreedValues, " values, got ",
          fields.size(), " (internal error)");
  kernels::AgreedRow row{};
  for (const Agreed& f : fields) row.values[row.count++] = f.value;
  const auto opts = carried.options().dtype(at::kLong);
  at::Tensor local = at::empty({width}, opts);
  local.narrow(0, 0, k).copy_(carried.reshape({k}));
  std::int64_t* values = local.data_ptr<std::int64_t>() + k;
  if (local.device().is_cpu())
    std::copy(row.values, row.values + row.count, values);
  else  // a kernel argument: no pageable copy, capturable
    launch_on(local, [&](void* stream) { kernels::write_agreed_row_cuda(values, row, stream); });
  at::Tensor table = at::empty({comm.size(), width}, opts);
  comm.all_gather(local.data_ptr(), table.data_ptr(), static_cast<std::size_t>(width),
                  ScalarKind::kInt64);
  if (!read) return table;
  const at::Tensor host = table.cpu();
  const std::int64_t* t = host.data_ptr<std::int64_t>();
  const int me = comm.rank();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const Agreed& f = fields[i];
    const auto describe = f.describe != nullptr ? f.describe : plain;
    const std::int64_t mine = t[me * width + k + static_cast<int64_t>(i)];
    for (int r = 0; r < comm.size(); ++r) {
      const std::int64_t other = t[r * width + k + static_cast<int64_t>(i)];
      if (other != mine)
        raise(f.argument, f.what, " is ", describe(mine), " on rank ", me, " but ", describe(other),
              " on rank ", r, ": ", why);
    }
  }
  return table;
}

bool agreement_needs_reading(const at::Tensor& t, const MeshPtr& mesh,
                             std::vector<std::int64_t> key) {
  if (t.device().is_cpu() || check_values_of(t)) return true;
  static SeenKeys seen;
  return seen.first_sighting(mesh, key);
}

std::int64_t dtype_code(const at::Tensor& t) { return static_cast<std::int64_t>(t.scalar_type()); }

std::string dtype_name(std::int64_t code) {
  return c10::toString(static_cast<at::ScalarType>(code));
}

namespace {

// 2^64 / golden ratio: odd, so every weight (2 i + 1) * kMix is odd and invertible mod 2^64.
constexpr std::uint64_t kMix = 0x9E3779B97F4A7C15ULL;

}  // namespace

at::Tensor value_checksum_ops(const at::Tensor& t) {
  const at::Tensor flat = t.reshape({-1}).to(at::kLong);
  const at::Tensor weights = at::arange(flat.numel(), flat.options())
                                 .mul_(2)
                                 .add_(1)
                                 .mul_(static_cast<std::int64_t>(kMix));
  return (flat * weights).sum();
}

at::Tensor value_checksum(const at::Tensor& t) {
  if (!t.device().is_cpu()) return value_checksum_ops(t);
  // One pass, no temporaries: unsigned arithmetic wraps modulo 2^64 by definition.
  const at::Tensor flat = t.reshape({-1}).to(at::kLong).contiguous();
  const std::int64_t* v = flat.const_data_ptr<std::int64_t>();
  std::uint64_t total = 0, weight = kMix;
  for (std::int64_t i = 0; i < flat.numel(); ++i, weight += 2 * kMix)
    total += static_cast<std::uint64_t>(v[i]) * weight;
  return at::scalar_tensor(static_cast<std::int64_t>(total), flat.options());
}

}  // namespace cpkit::detail
