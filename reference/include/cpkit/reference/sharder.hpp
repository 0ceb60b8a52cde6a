// prepare_cp_inputs / prepare_packed_cp_inputs and the Sharder they return (SPEC 2 and 3).
//
// Preparation computes every stream on the *global* padded sequence first (positions,
// document ids, padding flags, valid-target mask); a rank's shard is then a plain cut of
// columns [rank * L, (rank + 1) * L). Nothing is ever recomputed after the cut.
#pragma once

#include "cpkit/reference/batch.hpp"
#include "cpkit/reference/layout.hpp"

namespace cpkit::reference {

// Where one rank's shard sits in the global sequence.
struct Layout {
  int cp_size = 1;
  int rank = 0;
  std::int64_t seq_len = 0;     // S (or T) as given
  std::int64_t padded_len = 0;  // S_pad (SPEC 2b: a multiple of 2 * cp_size for head_tail)
  std::int64_t local_len = 0;   // L = S_pad / cp_size
  // The global position of each local token, in local order (every layout).
  std::vector<std::int64_t> positions;
  // The "contiguous" layout's range: rank * L and (rank + 1) * L; -1 for other layouts.
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// One microbatch's streams on the global padded sequence, before any cut.
struct GlobalStreams {
  std::int64_t seq_len = 0;
  std::int64_t padded_len = 0;
  // Padded to S_pad when shard_primary, else exactly as given (unpadded, for splicing).
  std::optional<IntMatrix> input_ids;
  std::optional<FloatRows> inputs_embeds;
  IntMatrix labels;        // [rows, S_pad], -100 on every padding token
  IntMatrix position_ids;  // [rows, S_pad]
  IntMatrix document_ids;  // [rows, S_pad], 1-based, 0 = padding past the sequence / last slot
  BoolMatrix padding;      // [rows, S_pad]
  BoolMatrix valid;        // [rows, S_pad], label counts as a loss target
  // THD only (empty for BSHD): offsets over real lengths and over slot lengths, [D + 1].
  IntVector cu_seqlens;
  IntVector cu_seqlens_padded;
  LayoutPositions owned;  // owned[r]: rank r's positions (SPEC 2b)
};

// What one rank receives for one microbatch.
struct LocalShard {
  Layout layout;
  std::optional<IntMatrix> input_ids;      // [rows, L] when shard_primary and ids were given
  std::optional<FloatRows> inputs_embeds;  // rows x [L, H] when shard_primary and embeds given
  IntMatrix labels;                        // [rows, L]
  IntMatrix position_ids;                  // [rows, L]
  IntMatrix document_ids;                  // [rows, L]
  BoolMatrix padding;                      // [rows, L]
  BoolVector valid;                        // [rows * L], row-major flattening of [rows, L]
};

class Sharder {
 public:
  Sharder(ShardOptions options, std::vector<GlobalStreams> microbatches, std::vector<Image> images);

  const ShardOptions& options() const { return options_; }
  int num_microbatches() const { return static_cast<int>(microbatches_.size()); }
  const GlobalStreams& global(int microbatch) const;
  const std::vector<Image>& images() const { return images_; }

  Layout layout(int microbatch, int rank) const;
  LocalShard local(int microbatch, int rank) const;

  // shard_primary == false: after the model spliced image embeddings into the global
  // [rows, S, H] embeddings of one microbatch, cut them exactly like the other streams
  // (zero padding to S_pad, then this rank's columns).
  FloatRows cut_spliced(int microbatch, int rank, const FloatRows& spliced) const;
  // Backward of cut_spliced on one rank: the local gradient placed into zeros [rows, S, H].
  FloatRows cut_spliced_backward(int microbatch, int rank, const FloatRows& grad_local) const;
  // The same cut for global ids [rows, S] (padded with pad_token_id).
  IntMatrix cut_ids(int microbatch, int rank, const IntMatrix& ids) const;

 private:
  void check_microbatch(int microbatch) const;
  void check_rank(int rank) const;

  ShardOptions options_;
  std::vector<GlobalStreams> microbatches_;
  std::vector<Image> images_;
};

// BSHD (SPEC 2). num_chunks must divide B.
Sharder prepare_cp_inputs(const BshdBatch& batch, const ShardOptions& options);
// THD (SPEC 3). The batch has one packed row per microbatch: num_chunks rows.
Sharder prepare_packed_cp_inputs(const PackedBatch& batch, const ShardOptions& options);

}  // namespace cpkit::reference
