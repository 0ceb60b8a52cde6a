#include "mesh_registry.hpp"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <map>
#include <mutex>
#include <utility>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/process_group.hpp"

namespace cpkit::python {

namespace {

// The group's own timeout, named in the error a dead peer raises (0: unknown).
std::chrono::milliseconds timeout_of(const c10::intrusive_ptr<c10d::Backend>& backend) {
  try {
    return backend->getBackendOptions()->timeout;
  } catch (const std::exception&) {
    return std::chrono::milliseconds(0);
  }
}

}  // namespace

MeshPtr mesh_for(const std::string& group_name, const at::Device& device) {
  if (group_name.empty()) return nullptr;
  static std::mutex mutex;
  // The Backend object keys the cache too: a group destroyed and created again under the
  // same name gets a new mesh.
  static std::map<std::tuple<std::string, std::string, const void*>, MeshPtr> meshes;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(group_name);
  } catch (const c10::Error& e) {
    raise("group_name", "\"", group_name, "\" names no live process group: ", e.msg());
  }
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(device.type());
  } catch (const std::exception&) {
    raise("mesh", "process group \"", group_name, "\" (", group->getBackendName(),
          ") has no backend for ", device.type(), " tensors: use gloo for CPU, nccl for CUDA");
  }
  const std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_tuple(group_name, device.str(), static_cast<const void*>(backend.get()));
  auto it = meshes.find(key);
  if (it == meshes.end())
    it = meshes.emplace(key, make_process_group_mesh(backend, device, timeout_of(backend))).first;
  return it->second;
}

}  // namespace cpkit::python
