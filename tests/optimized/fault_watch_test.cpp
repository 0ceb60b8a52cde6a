// The NCCL communicator's watchdog logic (comm/fault_watch.hpp) on the CPU, driven by fake
// hooks: a stalled operation or an engine error aborts the engine once and makes the next
// operation raise an error naming the one that failed; completed operations are released; no
// abort while an operation is being enqueued; a failed enqueue is final; background calls
// (a non-blocking init) are waited on for at most the timeout. Then the store keys that
// keep a second mesh from reading the first one's NCCL id.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/fault_watch.hpp"
#include "comm/store_meshes.hpp"
#include "cpkit/optimized/error.hpp"

namespace cpkit::detail {
namespace {

using std::chrono::milliseconds;

// Operations are ints; those in `finished` are complete.
struct FakeEngine {
  std::mutex mutex;
  std::set<void*> finished;
  std::multiset<void*> released;
  std::string error;
  std::atomic<int> aborts{0};

  FaultWatch::Hooks hooks() {
    return {.done =
                [this](void* t) {
                  const std::lock_guard<std::mutex> lock(mutex);
                  return finished.count(t) > 0;
                },
            .release =
                [this](void* t) {
                  const std::lock_guard<std::mutex> lock(mutex);
                  released.insert(t);
                },
            .engine_error =
                [this] {
                  const std::lock_guard<std::mutex> lock(mutex);
                  return error;
                },
            .abort = [this] { ++aborts; }};
  }
  void finish(void* t) {
    const std::lock_guard<std::mutex> lock(mutex);
    finished.insert(t);
  }
  size_t released_count(void* t) {
    const std::lock_guard<std::mutex> lock(mutex);
    return released.count(t);
  }
};

// Waits (at most 10 s) for the watch to record a fault.
std::string fault_of(const FaultWatch& watch) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (watch.fault().empty() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(2));
  return watch.fault();
}

int tokens[4];

void watch(FaultWatch& w, const char* operation, void* token) {
  w.enqueue(operation, [token] { return token; });
}

TEST(FaultWatch, CompletedOperationsAreReleasedAndNothingFails) {
  FakeEngine engine;
  {
    FaultWatch watch_(engine.hooks(), milliseconds(200), milliseconds(1));
    for (int& t : tokens) {
      engine.finish(&t);
      watch(watch_, "all-gather", &t);
    }
    std::this_thread::sleep_for(milliseconds(400));  // past the timeout: all were complete
    EXPECT_EQ(watch_.fault(), "");
    EXPECT_NO_THROW(watch(watch_, "reduce-scatter", nullptr));
  }
  for (int& t : tokens) EXPECT_EQ(engine.released_count(&t), 1u);
  EXPECT_EQ(engine.aborts.load(), 0);
}

TEST(FaultWatch, AStalledOperationAbortsAndTheNextOneRaises) {
  FakeEngine engine;
  FaultWatch watch_(engine.hooks(), milliseconds(30), milliseconds(1));
  engine.finish(&tokens[0]);
  watch(watch_, "all-gather", &tokens[0]);
  watch(watch_, "reduce-scatter", &tokens[1]);  // its peer never answers
  const std::string fault = fault_of(watch_);
  EXPECT_NE(fault.find("reduce-scatter did not complete within 30 ms"), std::string::npos) << fault;
  EXPECT_EQ(engine.aborts.load(), 1);
  bool enqueued = false;
  try {
    watch_.enqueue("all-reduce", [&]() -> void* {
      enqueued = true;
      return nullptr;
    });
    FAIL() << "no error after the abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "mesh");
    EXPECT_NE(std::string(e.what()).find("all-reduce cannot run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reduce-scatter did not complete"), std::string::npos);
  }
  EXPECT_FALSE(enqueued);  // nothing reaches an aborted engine
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(engine.aborts.load(), 1);  // aborted once
}

TEST(FaultWatch, AnEngineErrorAbortsNamingThePendingOperation) {
  FakeEngine engine;
  FaultWatch watch_(engine.hooks(), milliseconds(60000), milliseconds(1));
  watch(watch_, "loss-halo send/recv", &tokens[2]);
  {
    const std::lock_guard<std::mutex> lock(engine.mutex);
    engine.error = "remote process exited or there was a network error";
  }
  const std::string fault = fault_of(watch_);
  EXPECT_NE(fault.find("loss-halo send/recv failed: remote process exited"), std::string::npos)
      << fault;
  EXPECT_EQ(engine.aborts.load(), 1);
  EXPECT_THROW(watch(watch_, "all-gather", nullptr), Error);
}

TEST(FaultWatch, PendingTokensAreReleasedOnDestruction) {
  FakeEngine engine;
  {
    FaultWatch watch_(engine.hooks(), milliseconds(60000));
    watch(watch_, "all-gather", &tokens[3]);
  }
  EXPECT_EQ(engine.released_count(&tokens[3]), 1u);
  EXPECT_EQ(engine.aborts.load(), 0);
}

// The watchdog cannot abort (free) the engine while an operation is being enqueued: a stalled
// operation's timeout passes during a slow enqueue, and the abort waits for the enqueue.
TEST(FaultWatch, NoAbortWhileAnOperationIsEnqueued) {
  FakeEngine engine;
  FaultWatch watch_(engine.hooks(), milliseconds(10), milliseconds(1));
  watch(watch_, "all-gather", &tokens[0]);  // never completes
  int aborts_during_enqueue = -1;
  watch_.enqueue("reduce-scatter", [&]() -> void* {
    std::this_thread::sleep_for(milliseconds(100));  // ten timeouts
    aborts_during_enqueue = engine.aborts.load();
    return nullptr;
  });
  EXPECT_EQ(aborts_during_enqueue, 0);
  EXPECT_NE(fault_of(watch_).find("all-gather did not complete"), std::string::npos);
  EXPECT_EQ(engine.aborts.load(), 1);
}

// An enqueue that throws (NCCL refused the call, or a connection never settled) leaves the
// engine unusable: recorded, aborted, rethrown, and the next operation raises.
TEST(FaultWatch, AFailedEnqueueIsFinal) {
  FakeEngine engine;
  FaultWatch watch_(engine.hooks(), milliseconds(60000), milliseconds(1));
  EXPECT_THROW(
      watch_.enqueue("all-gather", []() -> void* { raise("mesh", "NCCL all-gather failed: x"); }),
      Error);
  EXPECT_NE(watch_.fault().find("all-gather could not be enqueued"), std::string::npos)
      << watch_.fault();
  EXPECT_EQ(engine.aborts.load(), 1);
  EXPECT_THROW(watch(watch_, "all-reduce", nullptr), Error);
}

TEST(WaitSettled, DoneFailedOrTimedOut) {
  int polls = 0;
  EXPECT_EQ(wait_settled(
                [&] {
                  return EngineState{++polls < 5 ? Progress::kInProgress : Progress::kDone, ""};
                },
                milliseconds(5000)),
            "");
  EXPECT_EQ(polls, 5);
  EXPECT_EQ(wait_settled(
                [] {
                  return EngineState{Progress::kFailed, "remote process exited"};
                },
                milliseconds(5000)),
            "remote process exited");
  // A peer that never joins: bounded by the timeout, not forever.
  const auto start = std::chrono::steady_clock::now();
  const std::string failed = wait_settled(
      [] {
        return EngineState{Progress::kInProgress, ""};
      },
      milliseconds(50));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(failed.find("did not finish within 50 ms"), std::string::npos) << failed;
  EXPECT_LT(took, std::chrono::seconds(2));
}

// Each rank's n-th mesh over a store reads the n-th key: ranks agree, meshes never share one.
TEST(StoreKeys, TheNthMeshOfEachRankSharesAKeyAndNoOtherDoes) {
  c10d::HashStore store;
  const std::string first0 = next_mesh_key(store, "nccl_unique_id", 0);
  const std::string second0 = next_mesh_key(store, "nccl_unique_id", 0);
  const std::string first1 = next_mesh_key(store, "nccl_unique_id", 1);
  const std::string second1 = next_mesh_key(store, "nccl_unique_id", 1);
  EXPECT_EQ(first0, first1);
  EXPECT_EQ(second0, second1);
  EXPECT_NE(first0, second0);
  EXPECT_NE(next_mesh_key(store, "other", 0), first0);
}

}  // namespace
}  // namespace cpkit::detail
