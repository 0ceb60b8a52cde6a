// Gloo meshes through c10d's ProcessGroupGloo. Debian's standalone libgloo is not linked:
// libtorch_cpu exports its own, newer Gloo symbols and the two would clash
// (docs/optimized.md); only libgloo-dev's headers are used, for ProcessGroupGloo.hpp.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <csignal>

#include "comm/store_meshes.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/process_group.hpp"

namespace cpkit {

namespace detail {

MeshPtr gloo_mesh_over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, bool loopback,
                             const std::string& interface) {
  if (size < 1) raise("size", "must be >= 1, got ", size);
  if (rank < 0 || rank >= size) raise("rank", "must be in [0, ", size, "), got ", rank);
  // A peer that dies closes its sockets; writing to them must raise (EPIPE), not kill this
  // process with SIGPIPE. Python ignores SIGPIPE already; a C++ trainer may not.
  std::signal(SIGPIPE, SIG_IGN);
  store->setTimeout(timeout);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  if (!interface.empty())
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  else if (loopback)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return make_process_group_mesh(group, at::kCPU, timeout);
}

}  // namespace detail

MeshPtr make_gloo_mesh(const std::string& store_path, int rank, int size,
                       std::chrono::milliseconds timeout) {
  if (size < 1) raise("size", "must be >= 1, got ", size);
  return detail::gloo_mesh_over_store(c10::make_intrusive<c10d::FileStore>(store_path, size), rank,
                                      size, timeout, /*loopback=*/true);
}

}  // namespace cpkit
