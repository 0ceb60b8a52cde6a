// Inputs of the two preparation operations (SPEC sections 2 and 3).
#pragma once

#include <string>

#include <optional>

#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

// How a batch is cut. The reference simulates all `cp_size` ranks at once.
struct ShardOptions {
  int cp_size = 1;                    // CP ranks, >= 1
  int num_chunks = 1;                 // pipeline microbatches along the batch axis, >= 1
  int pad_multiple = 1;               // S is padded to a multiple of cp_size * pad_multiple
  std::int64_t pad_token_id = 0;      // id written into padded id positions
  bool shard_primary = true;          // false: ids/embeddings stay global (image splicing)
  std::string layout = "contiguous";  // which rank owns which tokens (SPEC 2b)
  double balance_slack = 0.02;        // balanced: cost max / mean allowed above 1
};

// BSHD: every row is one sequence of S tokens. Exactly one of input_ids / inputs_embeds.
struct BshdBatch {
  std::optional<IntMatrix> input_ids;       // [B, S]
  std::optional<FloatRows> inputs_embeds;   // B x [S, H]
  IntMatrix labels;                         // [B, S], unshifted, -100 = ignore
  std::optional<IntMatrix> position_ids;    // [B, S], default 0..S-1 in every row
  std::optional<IntMatrix> attention_mask;  // [B, S], 1 keep, 0 padding
  std::vector<Image> images;                // complete images, passed through
};

// THD: one packed row per microbatch, documents laid out back to back in slots.
struct PackedBatch {
  std::optional<IntMatrix> input_ids;      // [num_chunks, T]
  std::optional<FloatRows> inputs_embeds;  // num_chunks x [T, H]
  IntMatrix labels;                        // [num_chunks, T], unshifted, -100 = ignore
  IntMatrix seq_lens;         // [num_chunks, D] real lengths; a ragged row ends in -1000s
  IntMatrix seq_lens_padded;  // [num_chunks, D] slot lengths, >= seq_lens, same sentinels
  std::vector<Image> images;
};

}  // namespace cpkit::reference
