// A KeyIndex (attention_plan.hpp) as the sequences of a varlen flash kernel (torch's
// _flash_attention_forward with cu_seqlens): runs of consecutive queries whose key ranges a
// kernel with bottom-right causal alignment (and a left window) or no mask reproduces
// exactly. Host-only arithmetic, tested on the CPU; the CUDA path of cp_attention feeds it
// to the flash kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cpkit/optimized/attention_plan.hpp"

namespace cpkit::detail {

// The sequences of one varlen call. Sequence i is queries[cu_q[i], cu_q[i+1]) (query rows)
// against key_slots[cu_k[i], cu_k[i+1]) (slots of the KeyIndex).
struct VarlenBatch {
  std::vector<std::int64_t> queries, key_slots;
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  std::int64_t max_q = 0, max_k = 0;
  bool empty() const { return queries.empty(); }
};

// Causal sequences: query j of a sequence of nq queries over nk keys sees keys
// [max(0, j + nk - nq - left), j + nk - nq] (no lower bound when left < 0): flash's causal
// mask aligned bottom-right with window (left, 0). Full sequences: every query sees every key.
struct VarlenRuns {
  std::int64_t left = -1;  // the causal call's left window: W - 1, or -1 for none
  VarlenBatch causal, full;
  bool empty() const { return causal.empty() && full.empty(); }
};

// Every query of `index` that sees a key lands in exactly one sequence, seeing exactly its
// listed slots in order; queries that see nothing land in none. Nullopt when some query's
// range cannot be expressed (more than `window` keys, or `index` malformed).
std::optional<VarlenRuns> varlen_runs(const KeyIndex& index, std::int64_t window);

// `runs` cut in two: the sequences whose key slots all lie below `first_remote` (a rank's own
// keys: attended while the received keys are in flight) and the others.
std::pair<VarlenRuns, VarlenRuns> split_at_slot(const VarlenRuns& runs, std::int64_t first_remote);

// cp_attention's two stages on the flash kernels: `first` over the rank's own keys (run
// while the received keys are in flight), then `second`. Without a window: the own keys'
// sequences, then the received keys' (slots from rows * L on), merged by log-sum-exp
// (`merge`). With one, whose received keys no varlen mask expresses on their own: the
// queries that see only their own keys, then the other queries over every key slot, each
// query in one stage. Nullopt when neither form exists (the caller's own kernel runs).
struct FlashStages {
  VarlenRuns first, second;
  bool merge = false;
};
std::optional<FlashStages> flash_stages(const AttentionPlan& plan);

}  // namespace cpkit::detail
