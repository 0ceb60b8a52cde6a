// CP meshes from the variables an existing launcher sets: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// with MASTER_ADDR / MASTER_PORT exported or given here). Ranks rendezvous through c10d's
// TCPStore; Gloo carries CPU tensors, NCCL CUDA tensors.
#pragma once

#include <ATen/Device.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// Where this process stands in the launched world.
struct LaunchEnv {
  std::string launcher;  // "torchrun" or "slurm"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  bool agent_store =
      false;  // torchrun's agent already serves the store (TORCHELASTIC_USE_AGENT_STORE)
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: keys of a restarted attempt start afresh
};

// Reads the launcher's variables through `getenv` (the process environment by default).
// `master_addr` / `master_port`, when given, take the place of MASTER_ADDR / MASTER_PORT.
// Missing, malformed or inconsistent variables raise cpkit::Error naming them and their
// values.
LaunchEnv read_launch_env(
    const std::function<const char*(const char*)>& getenv =
        [](const char* name) { return std::getenv(name); },
    const std::string& master_addr = "", int master_port = 0);

struct EnvMeshOptions {
  // Ranks per CP group; 0 = the whole world. The world is cut into world_size / cp_size
  // groups of contiguous ranks ([0, cp), [cp, 2 cp), ...), as Megatron and torchtitan place
  // CP innermost: CP rank = rank % cp_size, group = rank / cp_size (the DP index).
  int cp_size = 0;
  // CPU: Gloo. CUDA: NCCL on this device (index unset: LOCAL_RANK), one GPU per rank.
  at::Device device = at::kCPU;
  // Rendezvous and collective timeout: a missing or dead peer raises after it, never hangs.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  std::string master_addr;  // overrides MASTER_ADDR (Slurm: the first node of the job)
  int master_port = 0;      // overrides MASTER_PORT
};

struct EnvMesh {
  MeshPtr mesh;   // this rank's CP group
  LaunchEnv env;  // the world as launched
  int cp_size = 1;
  int cp_rank = 0;
  int cp_group = 0;  // which CP group (the DP index when world = DP x CP)
  int num_groups = 1;
};

EnvMesh make_mesh_from_env(const EnvMeshOptions& options = {});

}  // namespace cpkit
