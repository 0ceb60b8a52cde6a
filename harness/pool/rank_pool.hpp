// A pool of long-lived rank processes for property tests: 8 forked ranks join Gloo worlds of
// every size 1..8 once, then run a stream of cases. A case goes to ranks [0, cp) over pipes;
// each runs a registered task on its CP-`cp` mesh and replies with bytes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::pool {

inline constexpr int kMaxRanks = 8;

// A task body: (payload, mesh of size cp, rank) -> reply bytes. Exceptions become a reply
// that starts with kErrorPrefix followed by the message.
using Task = std::function<std::string(const std::string& payload, const MeshPtr& mesh, int rank)>;
inline const std::string kErrorPrefix =
    "\x01"
    "ERROR:";

// Tasks are registered before the pool starts (static registrars), so the forked ranks
// inherit them.
void register_task(const std::string& name, Task task);

struct TaskRegistrar {
  TaskRegistrar(const std::string& name, Task task) { register_task(name, std::move(task)); }
};

struct Reply {
  bool ok = false;    // the task returned (no exception)
  std::string bytes;  // its reply, or the exception message
};

class RankPool {
 public:
  // Starts the ranks on first use; they live until the process exits.
  static RankPool& instance();
  // Runs `task` with `payload` on ranks [0, cp). Throws if a rank dies or does not answer
  // within the limit (so a hang fails the property instead of the CI job).
  std::vector<Reply> run(int cp, const std::string& task, const std::string& payload);
  ~RankPool();

 private:
  RankPool();
  struct Worker {
    int pid = -1;
    int to_worker = -1;
    int from_worker = -1;
  };
  std::vector<Worker> workers_;
  std::string dir_;
};

}  // namespace cpkit::pool
