#include "rank_pool.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <stdexcept>

#include "cpkit/optimized/process_group.hpp"

namespace cpkit::pool {

namespace {

std::map<std::string, Task>& tasks() {
  static std::map<std::string, Task> registry;
  return registry;
}

constexpr int kReplyTimeoutMs = 120000;

void write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) throw std::runtime_error("rank pool: write to a rank failed");
    done += static_cast<std::size_t>(n);
  }
}

// Reads exactly `size` bytes, waiting at most `timeout_ms` for each chunk.
bool read_exact(int fd, char* out, std::size_t size, int timeout_ms) {
  std::size_t done = 0;
  while (done < size) {
    pollfd p{fd, POLLIN, 0};
    if (timeout_ms >= 0 && ::poll(&p, 1, timeout_ms) <= 0) return false;
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

void send_message(int fd, const std::string& bytes) {
  const std::uint64_t size = bytes.size();
  write_all(fd, std::string(reinterpret_cast<const char*>(&size), sizeof(size)) + bytes);
}

bool receive_message(int fd, std::string& bytes, int timeout_ms) {
  std::uint64_t size = 0;
  if (!read_exact(fd, reinterpret_cast<char*>(&size), sizeof(size), timeout_ms)) return false;
  bytes.resize(size);
  return read_exact(fd, bytes.data(), size, timeout_ms);
}

[[noreturn]] void worker_main(int rank, const std::string& dir, int in, int out) {
  // Meshes for every CP size this rank belongs to, built in the same order on every rank.
  std::vector<MeshPtr> meshes(kMaxRanks + 1);
  for (int cp = rank + 1; cp <= kMaxRanks; ++cp)
    meshes[cp] =
        make_gloo_mesh(dir + "/store" + std::to_string(cp), rank, cp, std::chrono::seconds(60));
  std::string message;
  while (receive_message(in, message, -1)) {
    // message: cp (1 byte) | task name length (1 byte) | name | payload
    const int cp = static_cast<unsigned char>(message[0]);
    const std::size_t name_len = static_cast<unsigned char>(message[1]);
    const std::string name = message.substr(2, name_len);
    const std::string payload = message.substr(2 + name_len);
    std::string reply;
    try {
      // Appended, not concatenated: GCC 12's -O3 -Wrestrict misfires on string + string.
      const std::string answer = tasks().at(name)(payload, meshes[cp], rank);
      reply.assign(1, '\0');
      reply.append(answer);
    } catch (const std::exception& e) {
      reply = kErrorPrefix + e.what();
    }
    send_message(out, reply);
  }
  _exit(0);
}

}  // namespace

void register_task(const std::string& name, Task task) { tasks()[name] = std::move(task); }

RankPool& RankPool::instance() {
  static RankPool pool;
  return pool;
}

RankPool::RankPool() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp ? tmp : "/tmp") + "/cpkit-pool-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("rank pool: mkdtemp failed");
  dir_ = pattern;
  for (int rank = 0; rank < kMaxRanks; ++rank) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("rank pool: pipe failed");
    const pid_t pid = fork();
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      for (const Worker& w : workers_) {  // the earlier ranks' parent ends are not ours
        close(w.to_worker);
        close(w.from_worker);
      }
      worker_main(rank, dir_, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    workers_.push_back({pid, down[1], up[0]});
  }
}

RankPool::~RankPool() {
  for (const Worker& w : workers_) close(w.to_worker);  // workers see EOF and exit
  for (const Worker& w : workers_) waitpid(w.pid, nullptr, 0);
  for (int cp = 1; cp <= kMaxRanks; ++cp) unlink((dir_ + "/store" + std::to_string(cp)).c_str());
  rmdir(dir_.c_str());
}

std::vector<Reply> RankPool::run(int cp, const std::string& task, const std::string& payload) {
  if (cp < 1 || cp > kMaxRanks)
    throw std::invalid_argument("rank pool: cp must be in [1, 8], got " + std::to_string(cp));
  const std::string message = std::string(1, static_cast<char>(cp)) +
                              std::string(1, static_cast<char>(task.size())) + task + payload;
  for (int r = 0; r < cp; ++r) send_message(workers_[r].to_worker, message);
  std::vector<Reply> replies(static_cast<std::size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    std::string bytes;
    if (!receive_message(workers_[r].from_worker, bytes, kReplyTimeoutMs))
      throw std::runtime_error("rank pool: rank " + std::to_string(r) + " of " +
                               std::to_string(cp) + " gave no answer to '" + task + "'");
    if (bytes.rfind(kErrorPrefix, 0) == 0) {
      replies[r] = {false, bytes.substr(kErrorPrefix.size())};
    } else {
      replies[r] = {true, bytes.substr(1)};
    }
  }
  return replies;
}

}  // namespace cpkit::pool
