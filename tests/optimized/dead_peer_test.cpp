// A dead or stalled rank makes every other rank raise an error naming the operation and the
// timeout, within a bounded time: never a hang.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <thread>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTimeout = std::chrono::milliseconds(2000);

// Rank `victim` misbehaves (`stall` false: exits at once; true: sleeps past the timeout);
// the others must raise within a few timeouts.
void check_peer_failure(bool stall) {
  const int world = 3, victim = 2;
  const auto start = Clock::now();
  const auto outcomes = testing::run_ranks(
      world,
      [&](int rank, const MeshPtr& mesh) {
        // Mid-training: the world is fully connected and has run a collective.
        std::int64_t barrier = 0;
        mesh->all_reduce_sum(&barrier, 1, ScalarKind::kInt64);
        if (rank == victim) {
          if (stall) std::this_thread::sleep_for(3 * kTimeout);
          _exit(0);
        }
        const auto began = Clock::now();
        try {
          gather_tokens(at::ones({4, 2}), mesh, true);
        } catch (const Error& e) {
          const std::string what = e.what();
          testing::require(what.find("all_gather") != std::string::npos,
                           "names the operation: " + what);
          testing::require(what.find("2000 ms") != std::string::npos, "names the timeout: " + what);
          testing::require(Clock::now() - began < 5 * kTimeout, "raised within a bounded time");
          return;
        }
        throw std::runtime_error("no error although rank 2 is gone");
      },
      /*limit=*/std::chrono::seconds(40), kTimeout);
  testing::expect_all_ranks_ok(outcomes);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "the whole run stays bounded";
}

TEST(DeadPeer, KilledRankMakesEveryOtherRankRaise) { check_peer_failure(false); }

TEST(DeadPeer, StalledRankPastTheTimeoutMakesEveryOtherRankRaise) { check_peer_failure(true); }

}  // namespace
}  // namespace cpkit
