// One rank of a launched world (torchrun or Slurm variables): make_mesh_from_env must put this
// process in CP group RANK / CP at CP rank RANK % CP, and its mesh must connect exactly the
// processes RANK in [g * CP, (g + 1) * CP) (spec 6: CP innermost, as Megatron and torchtitan
// place it). The truth is read here from the raw variables, not through read_launch_env.
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/launch.hpp"

namespace {

int raw_rank() {
  const char* torchrun = std::getenv("RANK");
  const char* slurm = std::getenv("SLURM_PROCID");
  return std::stoi(torchrun != nullptr ? torchrun : slurm);
}

std::string expected_group(int group, int cp) {
  std::ostringstream out;
  for (int r = group * cp; r < (group + 1) * cp; ++r) out << (r > group * cp ? " " : "") << r;
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--cp") {
    std::cerr << "usage: cpkit_launch_mapping --cp N\n";
    return 2;
  }
  const int cp = std::stoi(argv[2]);
  const int rank = raw_rank();
  try {
    cpkit::EnvMeshOptions options;
    options.cp_size = cp;
    const cpkit::EnvMesh em = cpkit::make_mesh_from_env(options);
    // Every member of this process's mesh says which launched rank it is.
    const at::Tensor members =
        cpkit::gather_tokens(at::tensor({static_cast<int64_t>(rank)}, at::kLong), em.mesh, false);
    std::ostringstream got;
    for (int64_t i = 0; i < members.numel(); ++i)
      got << (i > 0 ? " " : "") << members[i].item<int64_t>();
    const std::string want = expected_group(rank / cp, cp);
    const bool ok = em.cp_rank == rank % cp && em.cp_group == rank / cp &&
                    em.mesh->rank() == rank % cp && em.mesh->size() == cp && got.str() == want;
    std::cout << "rank " << rank << " (" << em.env.launcher << "): CP rank " << em.cp_rank
              << ", group " << em.cp_group << ", mesh of [" << got.str() << "], expected [" << want
              << "] at CP rank " << rank % cp << (ok ? ": ok" : ": WRONG") << std::endl;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cout << "rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
}
