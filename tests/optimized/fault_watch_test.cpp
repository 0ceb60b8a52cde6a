// The NCCL communicator's watchdog logic (comm/fault_watch.hpp) on the CPU, driven by fake
// hooks: a stalled operation or an engine error aborts the engine once and makes the next
// operation raise an error naming the one that failed; completed operations are released.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "comm/fault_watch.hpp"
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

TEST(FaultWatch, CompletedOperationsAreReleasedAndNothingFails) {
  FakeEngine engine;
  {
    FaultWatch watch(engine.hooks(), milliseconds(200), milliseconds(1));
    for (int& t : tokens) {
      engine.finish(&t);
      watch.watch("all-gather", &t);
    }
    std::this_thread::sleep_for(milliseconds(400));  // past the timeout: all were complete
    EXPECT_EQ(watch.fault(), "");
    EXPECT_NO_THROW(watch.raise_if_failed("reduce-scatter"));
  }
  for (int& t : tokens) EXPECT_EQ(engine.released_count(&t), 1u);
  EXPECT_EQ(engine.aborts.load(), 0);
}

TEST(FaultWatch, AStalledOperationAbortsAndTheNextOneRaises) {
  FakeEngine engine;
  FaultWatch watch(engine.hooks(), milliseconds(30), milliseconds(1));
  engine.finish(&tokens[0]);
  watch.watch("all-gather", &tokens[0]);
  watch.watch("reduce-scatter", &tokens[1]);  // its peer never answers
  const std::string fault = fault_of(watch);
  EXPECT_NE(fault.find("reduce-scatter did not complete within 30 ms"), std::string::npos) << fault;
  EXPECT_EQ(engine.aborts.load(), 1);
  try {
    watch.raise_if_failed("all-reduce");
    FAIL() << "no error after the abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "mesh");
    EXPECT_NE(std::string(e.what()).find("all-reduce cannot run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reduce-scatter did not complete"), std::string::npos);
  }
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(engine.aborts.load(), 1);  // aborted once
}

TEST(FaultWatch, AnEngineErrorAbortsNamingThePendingOperation) {
  FakeEngine engine;
  FaultWatch watch(engine.hooks(), milliseconds(60000), milliseconds(1));
  watch.watch("loss-halo send/recv", &tokens[2]);
  {
    const std::lock_guard<std::mutex> lock(engine.mutex);
    engine.error = "remote process exited or there was a network error";
  }
  const std::string fault = fault_of(watch);
  EXPECT_NE(fault.find("loss-halo send/recv failed: remote process exited"), std::string::npos)
      << fault;
  EXPECT_EQ(engine.aborts.load(), 1);
  EXPECT_THROW(watch.raise_if_failed("all-gather"), Error);
}

TEST(FaultWatch, PendingTokensAreReleasedOnDestruction) {
  FakeEngine engine;
  { FaultWatch(engine.hooks(), milliseconds(60000)).watch("all-gather", &tokens[3]); }
  EXPECT_EQ(engine.released_count(&tokens[3]), 1u);
  EXPECT_EQ(engine.aborts.load(), 0);
}

}  // namespace
}  // namespace cpkit::detail
