// Which keys each CP rank needs from each other rank for cp_attention (docs/spec.md section
// 4b), derived from the shard alone: every rank computes the same sets with no
// communication. The transport of cp_attention moves exactly these keys; the byte counts
// here are what it moves.
#pragma once

#include <cstdint>
#include <vector>

#include "cpkit/optimized/sharder.hpp"

namespace cpkit {

// Which key slots each local query sees (the attention kernel's view). Key slots: this rank's
// rows * L tokens (row-major), then the received keys (source rank order, each source's recv
// order). `slots` lists key slots grouped by (row, document), each group sorted by position;
// query i (row-major local index) sees exactly slots[begin[i], end[i]) (its document's keys at
// positions (pos - W, pos]; nothing for document 0; never a padding key).
struct KeyIndex {
  std::vector<std::int64_t> slots, begin, end;
};

struct AttentionPlan {
  int cp_size = 1;
  int rank = 0;
  std::int64_t rows = 0;       // batch rows of the microbatch
  std::int64_t local_len = 0;  // L
  std::int64_t window = 0;     // 0: none
  // send[o]: this rank's tokens that some query of rank o may see, as row-major local indices
  // (b * L + j), ascending; empty for o == rank.
  std::vector<std::vector<std::int64_t>> send;
  // recv[o]: rank o's tokens this rank's queries may see, as o's row-major local indices,
  // ascending (= rank o's send[rank]); empty for o == rank.
  std::vector<std::vector<std::int64_t>> recv;

  // Every key each query sees; its own keys alone (attention's first stage, while the others
  // are in flight); the received keys alone (the second stage).
  KeyIndex all_keys, own_keys, remote_keys;

  // Keys received (forward) = key gradients returned (backward), summed over sources.
  std::int64_t received_keys() const;
  // What an all-gather of the keys would bring this rank: (CP - 1) * rows * L.
  std::int64_t all_gather_keys() const { return (cp_size - 1) * rows * local_len; }
};

// What the plan moves: the keys each rank needs (cp_attention's design), or every key, as an
// all-gather would (the baseline bench/ compares against; the same outputs).
enum class KeyExchange { kNeeded, kAll };

// The plan of `rank`'s shard of microbatch `microbatch`, for a sliding window of `window`
// keys (0: none). Raises naming `window` when it is negative, `rank` when out of range.
AttentionPlan attention_plan(const Sharder& sharder, int microbatch, int rank,
                             std::int64_t window = 0, KeyExchange keys = KeyExchange::kNeeded);

}  // namespace cpkit
