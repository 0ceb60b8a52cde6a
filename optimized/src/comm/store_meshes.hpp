// Meshes over any c10d Store (internal header): the FileStore factories of tests and tools and
// the TCPStore factory of launched trainers share these, so a mesh is built one way.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::detail {

// ProcessGroupGloo over `store`; its sockets bind to `interface` (a name such as "eth0", or
// empty: the loopback address when `loopback`, else the address the host name resolves to).
MeshPtr gloo_mesh_over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, bool loopback,
                             const std::string& interface = "");

// cpkit's NCCL communicator on `device`; rank 0's unique id travels through `store`; an
// operation not complete after `timeout` aborts it (comm/fault_watch.hpp).
MeshPtr nccl_mesh_over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             int device, std::chrono::milliseconds timeout);

// The key of the value (`what`, e.g. "nccl_unique_id") for the n-th mesh that `rank` makes
// over `store`: ranks making their n-th mesh agree on it, and a later mesh never reads an
// earlier one's (stale) value, as a fixed key would let it.
std::string next_mesh_key(c10d::Store& store, const std::string& what, int rank);

}  // namespace cpkit::detail
