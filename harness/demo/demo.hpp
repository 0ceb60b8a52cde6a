// cpkit-demo: a packed batch cut across CP ranks, printed rank by rank with its loss.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cpkit/reference/reference.hpp"

namespace cpkit::demo {

struct DemoOptions {
  int cp = 4;
  std::vector<std::int64_t> doc_lens = {7, 0, 11, 3, 9};
  int slot_multiple = 2;  // each document's slot is its length rounded up to this
  int tail = 3;           // row-tail padding tokens after the last slot
  int vocab = 32;
  std::uint64_t seed = 1;
  std::string layout = "contiguous";  // spec 2b: contiguous, head_tail or balanced
  double balance_slack = 0.02;        // balanced: work and tile cost allowed above even
  std::string impl = "reference";
  std::string launcher = "fork";  // fork: --cp rank processes; env: one rank of torchrun/srun
  bool help = false;
};

// Parses argv; throws std::invalid_argument naming the flag on bad input.
DemoOptions parse_options(int argc, char** argv);
void print_help(std::ostream& os);

// The per-rank and combined results of one run.
struct DemoResult {
  std::vector<reference::LocalShard> shards;
  std::vector<reference::RankLoss> losses;
  double combined = 0;       // mean over ranks of the returned losses
  double single_device = 0;  // HF shifted mean CE on the unsharded row
};

reference::PackedBatch make_demo_batch(const DemoOptions& options);
// Logits [T_pad, V] of the whole padded row, so every rank and the single device agree.
reference::FloatMatrix make_demo_logits(const DemoOptions& options, Eigen::Index padded_len);
DemoResult run_reference(const DemoOptions& options);
// The same batch through cpkit's optimized path in `cp` real rank processes over Gloo.
DemoResult run_optimized(const DemoOptions& options);
// --launcher env: this process is one rank of a world started by torchrun or srun; CP groups
// of --cp contiguous ranks each run the demo batch (seed + group index, so DP groups differ).
// Prints this rank's line and returns whether its shard and loss equal the reference's.
bool run_launched(const DemoOptions& options, std::ostream& os);
// Shards equal and losses within FP32 tolerance; prints what differs.
bool same_result(const DemoResult& optimized, const DemoResult& reference, std::ostream& os);
bool same_rank(const reference::LocalShard& a, double loss_a, const reference::LocalShard& b,
               double loss_b, std::ostream& os);
void print_report(const DemoOptions& options, const reference::PackedBatch& batch,
                  const DemoResult& result, std::ostream& os);

}  // namespace cpkit::demo
