// The collective engine's watchdog (comm/fault_watch.hpp).
#include "comm/fault_watch.hpp"

#include "cpkit/optimized/error.hpp"

namespace cpkit::detail {

FaultWatch::FaultWatch(Hooks hooks, std::chrono::milliseconds timeout,
                       std::chrono::milliseconds poll)
    : hooks_(std::move(hooks)), timeout_(timeout), poll_(poll), thread_([this] { run(); }) {}

FaultWatch::~FaultWatch() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (const Pending& p : pending_) hooks_.release(p.token);
}

void FaultWatch::enqueue(const char* operation, const std::function<void*()>& enqueue) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!fault_.empty())
      raise("mesh", operation, " cannot run: the communicator was aborted after ", fault_);
    void* token = nullptr;
    try {
      token = enqueue();
    } catch (const std::exception& e) {
      fail(std::string(operation) + " could not be enqueued: " + e.what());
      throw;
    }
    if (token == nullptr) return;
    pending_.push_back({operation, token, std::chrono::steady_clock::now() + timeout_});
  }
  wake_.notify_all();
}

std::string FaultWatch::fault() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return fault_;
}

void FaultWatch::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    // Idle while nothing is pending; otherwise look every poll_.
    if (pending_.empty() && fault_.empty())
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    else
      wake_.wait_for(lock, poll_, [&] { return stopping_; });
    if (stopping_ || !poll_once()) return;
  }
}

bool FaultWatch::poll_once() {
  if (!fault_.empty()) return false;
  const std::string engine = hooks_.engine_error();
  if (!engine.empty()) {
    const std::string operation = pending_.empty() ? "an operation" : pending_.front().operation;
    fail(operation + " failed: " + engine);
    return false;
  }
  while (!pending_.empty() && hooks_.done(pending_.front().token)) {
    hooks_.release(pending_.front().token);
    pending_.pop_front();
  }
  if (!pending_.empty() && std::chrono::steady_clock::now() > pending_.front().deadline) {
    fail(pending_.front().operation + " did not complete within " +
         std::to_string(timeout_.count()) + " ms (a peer rank died or stalled)");
    return false;
  }
  return true;
}

void FaultWatch::fail(std::string message) {
  fault_ = std::move(message);
  hooks_.abort();
}

std::string wait_settled(const std::function<EngineState()>& state,
                         std::chrono::milliseconds timeout, std::chrono::milliseconds poll) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const EngineState now = state();
    if (now.progress == Progress::kDone) return "";
    if (now.progress == Progress::kFailed) return now.error;
    if (std::chrono::steady_clock::now() > deadline)
      return "did not finish within " + std::to_string(timeout.count()) +
             " ms (a peer rank died or stalled)";
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace cpkit::detail
