// Real rank processes for tests and tools: `world` forked processes join a Gloo world over loopback
// (FileStore rendezvous) and each runs the same body. No in-process fake of collectives.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::ranks {

struct RankOutcome {
  int rank = 0;
  bool ok = false;
  std::string message;  // the body's exception text, or why the process ended
  std::string output;   // what a collecting body returned
};

using RankBody = std::function<void(int rank, const MeshPtr& mesh)>;
using CollectingRankBody = std::function<std::string(int rank, const MeshPtr& mesh)>;

// Forks `world` ranks, each builds a Gloo mesh and runs `body`; an exception in the body
// fails that rank. Ranks still running after `limit` are killed and reported.
std::vector<RankOutcome> run_ranks(
    int world, const RankBody& body, std::chrono::milliseconds limit = std::chrono::seconds(60),
    std::chrono::milliseconds collective_timeout = std::chrono::seconds(20));
// The same, keeping each rank's returned text in RankOutcome::output.
std::vector<RankOutcome> run_ranks_collect(
    int world, const CollectingRankBody& body,
    std::chrono::milliseconds limit = std::chrono::seconds(60),
    std::chrono::milliseconds collective_timeout = std::chrono::seconds(20));

// Inside a rank body: throw with a message (the parent reports it).
void require(bool condition, const std::string& what);
// The closeness rule of harness/compare/closeness.hpp (NaN is never close).
void require_close(const at::Tensor& actual, const at::Tensor& expected, double atol, double rtol,
                   const std::string& what);
void require_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what);

}  // namespace cpkit::ranks
