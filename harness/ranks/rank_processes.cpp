#include "rank_processes.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "cpkit/optimized/process_group.hpp"
#include "tensor_closeness.hpp"

namespace cpkit::ranks {

namespace {

// Plain POSIX, not std::filesystem: libtorch.so exports std::filesystem symbols of its own
// libstdc++ build, and calls into them from our binary crash (see docs/optimized.md).
std::string make_run_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp ? tmp : "/tmp") + "/cpkit-ranks-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

void remove_run_dir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

std::string rank_file(const std::string& dir, int rank) {
  return dir + "/rank" + std::to_string(rank) + ".txt";
}

[[noreturn]] void run_child(int rank, int world, const std::string& dir,
                            const CollectingRankBody& body, std::chrono::milliseconds timeout) {
  std::string message;
  int code = 0;
  try {
    const MeshPtr mesh = make_gloo_mesh(dir + "/store", rank, world, timeout);
    message = body(rank, mesh);  // on success the file holds the output
  } catch (const std::exception& e) {
    message = e.what();
    code = 1;
  } catch (...) {
    message = "unknown exception";
    code = 1;
  }
  std::ofstream(rank_file(dir, rank)) << message;
  std::fflush(nullptr);
  _exit(code);  // skip static destructors and gtest's at-exit work in the child
}

}  // namespace

std::vector<RankOutcome> run_ranks(int world, const RankBody& body, std::chrono::milliseconds limit,
                                   std::chrono::milliseconds collective_timeout) {
  return run_ranks_collect(
      world,
      [&body](int rank, const MeshPtr& mesh) {
        body(rank, mesh);
        return std::string();
      },
      limit, collective_timeout);
}

std::vector<RankOutcome> run_ranks_collect(int world, const CollectingRankBody& body,
                                           std::chrono::milliseconds limit,
                                           std::chrono::milliseconds collective_timeout) {
  const std::string dir = make_run_dir();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) run_child(rank, world, dir, body, collective_timeout);
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(static_cast<std::size_t>(world));
  std::vector<bool> done(static_cast<std::size_t>(world), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int remaining = world;
  while (remaining > 0) {
    for (int rank = 0; rank < world; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --remaining;
      RankOutcome& o = outcomes[rank];
      o.rank = rank;
      o.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      std::ifstream in(rank_file(dir, rank));
      std::stringstream text;
      text << in.rdbuf();
      (o.ok ? o.output : o.message) = text.str();
      if (WIFSIGNALED(status))
        o.message += " (killed by signal " + std::to_string(WTERMSIG(status)) + ")";
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < world; ++rank)
        if (!done[rank]) {
          kill(pids[rank], SIGKILL);
          waitpid(pids[rank], nullptr, 0);
          outcomes[rank] = {rank, false, "still running after the test's time limit: killed", ""};
          done[rank] = true;
        }
      remaining = 0;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  remove_run_dir(dir);
  return outcomes;
}

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

void require_close(const at::Tensor& actual, const at::Tensor& expected, double atol, double rtol,
                   const std::string& what) {
  const std::string diff = harness::tensor_mismatch(actual, expected, atol, rtol);
  if (!diff.empty()) throw std::runtime_error(what + ": " + diff);
}

void require_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  require(actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type() &&
              at::equal(actual, expected),
          what + ": tensors differ");
}

}  // namespace cpkit::ranks
