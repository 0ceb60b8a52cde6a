// A watchdog for a collective engine whose operations complete asynchronously (NCCL on a
// CUDA stream): a background thread polls each enqueued operation and the engine's own
// error state; an operation past the timeout or an engine error aborts the engine, so
// nothing waits on it forever, and the next operation raises cpkit::Error naming the one
// that failed. Plain C++ (no CUDA): the engine is reached through hooks, so the CPU tests
// drive it with fakes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cpkit::detail {

class FaultWatch {
 public:
  struct Hooks {
    std::function<bool(void* token)> done;      // has the operation behind `token` completed?
    std::function<void(void* token)> release;   // the token is no longer needed
    std::function<std::string()> engine_error;  // empty while the engine reports none
    std::function<void()> abort;                // tears the engine down; its waits return
  };

  FaultWatch(Hooks hooks, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = std::chrono::milliseconds(20));
  ~FaultWatch();  // stops the thread and releases the tokens still pending
  FaultWatch(const FaultWatch&) = delete;
  FaultWatch& operator=(const FaultWatch&) = delete;

  // Enqueues `operation` under the watch's lock, so the watchdog cannot abort (and free) the
  // engine between the fault check and the enqueue: raises the recorded fault, if any; else
  // runs `enqueue`, which returns a token that completes with the operation (watched from
  // then on) or nullptr (nothing to follow). An `enqueue` that throws leaves the engine
  // unusable: the error is recorded as the fault, the engine aborted, and the error rethrown.
  void enqueue(const char* operation, const std::function<void*()>& enqueue);
  // The recorded fault ("" while there is none).
  std::string fault() const;

 private:
  struct Pending {
    std::string operation;
    void* token;
    std::chrono::steady_clock::time_point deadline;
  };
  void run();
  bool poll_once();  // false once aborted; called with mutex_ held
  void fail(std::string message);

  Hooks hooks_;
  std::chrono::milliseconds timeout_, poll_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::string fault_;
  bool stopping_ = false;
  std::thread thread_;
};

// An engine call that completes in the background (a non-blocking NCCL init, a finalize, an
// enqueue still connecting): its state as seen by one poll.
enum class Progress { kDone, kInProgress, kFailed };
struct EngineState {
  Progress progress;
  std::string error;  // what failed, for kFailed
};

// Polls `state` until it leaves kInProgress or `timeout` passes: "" once done, else what
// failed (the engine's error, or that it did not finish within the timeout).
std::string wait_settled(const std::function<EngineState()>& state,
                         std::chrono::milliseconds timeout,
                         std::chrono::milliseconds poll = std::chrono::milliseconds(1));

}  // namespace cpkit::detail
