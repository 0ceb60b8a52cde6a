// Varlen attention offsets of one rank's shard (docs/spec.md section 4a): what
// FlashAttention-style kernels (cu_seqlens) need to give the exact document-causal mask over
// the contiguous all-gather layout, for any document lengths.
#pragma once

#include "cpkit/reference/sharder.hpp"

namespace cpkit::reference {

struct AttentionOffsets {
  // Segment i: queries [cu_seqlens_q[i], cu_seqlens_q[i + 1]) of the shard (rows flattened,
  // row-major), keys [cu_seqlens_k[i], cu_seqlens_k[i + 1]) of the kernel's keys: rows of
  // the gathered keys, columns [k_begin, k_end) of each, flattened. Causal, bottom-right.
  IntVector cu_seqlens_q;
  IntVector cu_seqlens_k;
  std::int64_t max_seqlen_q = 0;
  std::int64_t max_seqlen_k = 0;
  std::int64_t k_begin = 0;  // the first gathered key any local query attends to
  std::int64_t k_end = 0;    // one past the last: the rank's own end
  // Layouts other than "contiguous" (SPEC 4a): the kernel's keys are these rows of the
  // gathered keys (rank order, rows flattened: row b's rank-order token c at b * CP * L + c);
  // k_begin and k_end are then unused. Empty for "contiguous".
  IntVector k_index;
};

AttentionOffsets attention_offsets(const Sharder& sharder, int microbatch, int rank);

}  // namespace cpkit::reference
