// Varlen attention offsets of one rank's shard (docs/spec.md section 4a): cu_seqlens for
// FlashAttention-style kernels (flash_attn_varlen_func, cuDNN / TransformerEngine THD,
// torch.nn.attention.varlen) that give the exact document-causal mask over the contiguous
// all-gather layout, for any document lengths.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace cpkit {

class Sharder;

struct AttentionOffsets {
  // Segment i: queries [cu_seqlens_q[i], cu_seqlens_q[i + 1]) of the shard (rows flattened,
  // row-major), keys [cu_seqlens_k[i], cu_seqlens_k[i + 1]) of the kernel's keys: columns
  // [k_begin, k_end) of every row of the gathered keys, flattened. Causal, bottom-right
  // aligned. int32, on the shard's device.
  at::Tensor cu_seqlens_q;
  at::Tensor cu_seqlens_k;
  std::int64_t max_seqlen_q = 0;
  std::int64_t max_seqlen_k = 0;
  std::int64_t k_begin = 0;  // the first gathered key any local query attends to
  std::int64_t k_end = 0;    // one past the last: the rank's own end
  // Layouts other than contiguous (docs/spec.md 4a): the kernel's keys are
  // gathered.flatten(0, 1).index_select(0, k_index), gathered being the rank-order
  // all-gather [rows, CP * L, ...]; k_begin and k_end are then unused. Undefined (and a
  // slice suffices) for the contiguous layout. int64, on the shard's device.
  at::Tensor k_index;
};

// Raises cpkit::Error naming attention_mask (padding between real tokens of a row) or
// position_ids (positions that do not increase): masks no varlen offsets can express.
AttentionOffsets attention_offsets(const Sharder& sharder, int microbatch, int rank);

}  // namespace cpkit
