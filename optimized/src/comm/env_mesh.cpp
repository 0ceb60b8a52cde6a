// make_mesh_from_env: one TCPStore for the launched world, a PrefixStore per CP group, and a
// Gloo or NCCL mesh over it (store_meshes.hpp, shared with the FileStore factories).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>
#include <vector>

#include "comm/store_meshes.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/launch.hpp"

namespace cpkit {

namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The world's store: torchrun's agent serves one at MASTER_ADDR:MASTER_PORT already (every
// worker is a client, keys under the attempt's prefix, as torch.distributed does); otherwise
// rank 0 serves it.
c10::intrusive_ptr<c10d::Store> world_store(const LaunchEnv& env,
                                            std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.timeout = timeout;
  if (env.agent_store) {
    options.isServer = false;
    options.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.restart_count), store);
  }
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

}  // namespace

EnvMesh make_mesh_from_env(const EnvMeshOptions& options) {
  EnvMesh out;
  out.env = read_launch_env([](const char* name) { return std::getenv(name); }, options.master_addr,
                            options.master_port);
  const LaunchEnv& env = out.env;
  if (options.cp_size < 0)
    raise("cp_size", "must be >= 0 (0: the whole world), got ", options.cp_size);
  out.cp_size = options.cp_size == 0 ? env.world_size : options.cp_size;
  if (env.world_size % out.cp_size != 0)
    raise("cp_size", "is ", out.cp_size, " but the world holds ", env.world_size,
          " ranks: the world must be a whole number of CP groups (world = DP x CP)");
  if (options.timeout.count() <= 0)
    raise("timeout", "must be positive, got ", options.timeout.count(), " ms");
  out.cp_rank = env.rank % out.cp_size;
  out.cp_group = env.rank / out.cp_size;
  out.num_groups = env.world_size / out.cp_size;

  const c10::intrusive_ptr<c10d::Store> world = world_store(env, options.timeout);
  const std::string prefix = "cpkit/cp" + std::to_string(out.cp_size);
  const auto store = c10::make_intrusive<c10d::PrefixStore>(
      prefix + "/group" + std::to_string(out.cp_group), world);
  if (options.device.is_cuda()) {
    const int device = options.device.has_index() ? options.device.index() : env.local_rank;
    out.mesh =
        detail::nccl_mesh_over_store(store, out.cp_rank, out.cp_size, device, options.timeout);
  } else if (options.device.is_cpu()) {
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    out.mesh =
        detail::gloo_mesh_over_store(store, out.cp_rank, out.cp_size, options.timeout,
                                     is_loopback(env.master_addr), interface ? interface : "");
  } else {
    raise("device", "must be a CPU (Gloo) or CUDA (NCCL) device, got ", options.device);
  }
  // Where rank 0 serves the store, it must outlive every group's rendezvous: a rank that
  // returned and exited early took the server down under a slower group (seen under Slurm
  // variables: "Connection was likely closed"). Every rank reports in; rank 0 waits for all.
  if (!env.agent_store) {
    world->set(prefix + "/connected/" + std::to_string(env.rank), std::vector<uint8_t>{1});
    if (env.rank == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < env.world_size; ++r)
        keys.push_back(prefix + "/connected/" + std::to_string(r));
      world->wait(keys, options.timeout);
    }
  }
  return out;
}

}  // namespace cpkit
