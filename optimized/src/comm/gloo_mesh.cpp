// A Gloo world over loopback through c10d's ProcessGroupGloo. Debian's standalone libgloo
// is not linked: libtorch_cpu exports its own, newer Gloo symbols and the two would clash
// (docs/optimized.md); only libgloo-dev's headers are used, for ProcessGroupGloo.hpp.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <csignal>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/process_group.hpp"

namespace cpkit {

MeshPtr make_gloo_mesh(const std::string& store_path, int rank, int size,
                       std::chrono::milliseconds timeout) {
  if (size < 1) raise("size", "must be >= 1, got ", size);
  if (rank < 0 || rank >= size) raise("rank", "must be in [0, ", size, "), got ", rank);
  // A peer that dies closes its sockets; writing to them must raise (EPIPE), not kill this
  // process with SIGPIPE. Python ignores SIGPIPE already; a C++ trainer may not.
  std::signal(SIGPIPE, SIG_IGN);
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, size);
  store->setTimeout(timeout);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return make_process_group_mesh(group, at::kCPU, timeout);
}

}  // namespace cpkit
