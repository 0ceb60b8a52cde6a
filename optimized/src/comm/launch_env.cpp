// read_launch_env: torchrun's or Slurm's variables, checked.
#include <cerrno>
#include <cstdlib>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/launch.hpp"

namespace cpkit {

namespace {

using Getenv = std::function<const char*(const char*)>;

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value > 1'000'000'000)
    raise(name, "must be a non-negative integer, got \"", text, "\"");
  return static_cast<int>(value);
}

// The first of `names` that is set, as an integer; raises naming all of them when none is.
int required_int(const Getenv& getenv, std::initializer_list<const char*> names, const char* why) {
  std::string tried;
  for (const char* name : names) {
    if (const char* text = getenv(name)) return parse_int(name, text);
    tried += tried.empty() ? name : std::string(" or ") + name;
  }
  raise(tried, "is not set; ", why);
}

}  // namespace

LaunchEnv read_launch_env(const Getenv& getenv, const std::string& master_addr, int master_port) {
  LaunchEnv env;
  const bool torchrun = getenv("RANK") != nullptr || getenv("WORLD_SIZE") != nullptr;
  const bool slurm = getenv("SLURM_PROCID") != nullptr;
  if (!torchrun && !slurm)
    raise("RANK",
          "neither torchrun's RANK / WORLD_SIZE nor Slurm's SLURM_PROCID / SLURM_NTASKS "
          "is set: start the program with torchrun, srun or mpirun-with-torchrun-variables");
  env.launcher = torchrun ? "torchrun" : "slurm";
  const char* why = torchrun ? "torchrun sets RANK, WORLD_SIZE and LOCAL_RANK for every worker"
                             : "srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID";
  if (torchrun) {
    env.rank = required_int(getenv, {"RANK"}, why);
    env.world_size = required_int(getenv, {"WORLD_SIZE"}, why);
    env.local_rank = required_int(getenv, {"LOCAL_RANK"}, why);
  } else {
    env.rank = required_int(getenv, {"SLURM_PROCID"}, why);
    env.world_size = required_int(getenv, {"SLURM_NTASKS"}, why);
    env.local_rank = required_int(getenv, {"SLURM_LOCALID"}, why);
  }
  const char* rank_name = torchrun ? "RANK" : "SLURM_PROCID";
  const char* world_name = torchrun ? "WORLD_SIZE" : "SLURM_NTASKS";
  if (env.world_size < 1) raise(world_name, "must be >= 1, got ", env.world_size);
  if (env.rank >= env.world_size)
    raise(rank_name, "is ", env.rank, " but ", world_name, " is ", env.world_size,
          ": the rank must be below the world size");
  if (env.local_rank > env.rank)
    raise(torchrun ? "LOCAL_RANK" : "SLURM_LOCALID", "is ", env.local_rank, " but ", rank_name,
          " is only ", env.rank, ": a local rank never exceeds the global rank");

  if (!master_addr.empty()) {
    env.master_addr = master_addr;
  } else if (const char* addr = getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  } else {
    raise("MASTER_ADDR", "is not set; ",
          torchrun ? "torchrun sets it"
                   : "under Slurm export the first node's address "
                     "(scontrol show hostnames | head -1) or pass master_addr");
  }
  if (master_port > 0) {
    env.master_port = master_port;
  } else {
    env.master_port = required_int(
        getenv, {"MASTER_PORT"},
        torchrun ? "torchrun sets it" : "under Slurm export a free port or pass master_port");
  }
  if (env.master_port < 1 || env.master_port > 65535)
    raise("MASTER_PORT", "must be a TCP port in [1, 65535], got ", env.master_port);
  if (const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE"))
    env.agent_store = std::string(agent) == "True" || std::string(agent) == "1";
  if (const char* restarts = getenv("TORCHELASTIC_RESTART_COUNT"))
    env.restart_count = parse_int("TORCHELASTIC_RESTART_COUNT", restarts);
  return env;
}

}  // namespace cpkit
