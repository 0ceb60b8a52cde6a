#include "mesh_registry.hpp"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

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

// A fresh mesh per call (a small object; the group lookup is needed anyway). No cache: a
// process-wide one kept every backend alive until static destruction at exit, after
// destroy_process_group, where tearing a ProcessGroupGloo down could abort the process
// ("terminate called without an active exception", seen once at CP 3 in CI).
MeshPtr mesh_for(const std::string& group_name, const at::Device& device) {
  if (group_name.empty()) return nullptr;
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
  return make_process_group_mesh(backend, device, timeout_of(backend), group_name);
}

}  // namespace cpkit::python
