// A BSHD shard's token streams in one pass per token, written once for the CPU loop and the
// CUDA kernel (plain C++ header, safe for nvcc; docs/spec.md section 2): the row is one
// document, positions come from the global sequence (or continue the given position_ids
// past its end), and padding is what lies past the row or under attention_mask == 0.
#pragma once

#include <cstdint>

#include "cpkit/optimized/constants.hpp"
#include "kernels/host_device.hpp"
#include "kernels/targets.hpp"

namespace cpkit::kernels {

struct BshdLayoutArgs {
  const std::int64_t* labels;     // [rows, seq_len], rows `labels_pitch` elements apart
  const std::int64_t* mask;       // attention_mask as int64 like labels, or null
  const std::int64_t* positions;  // given position_ids like labels, or null
  std::int64_t labels_pitch, mask_pitch, positions_pitch;
  std::int64_t rows, seq_len;
  std::int64_t begin;      // first global column of this fragment of the shard
  std::int64_t count;      // its columns; outputs are [rows, count] with rows out_pitch apart
  std::int64_t out_pitch;  // the shard's local_len
  std::int64_t* position;
  std::int64_t* document;
  bool* padding;
  std::int64_t* label;
  bool* valid;
};

// Token (row, j) of the fragment: global column t = begin + j.
CPKIT_HOST_DEVICE inline void bshd_token(const BshdLayoutArgs& a, std::int64_t row,
                                         std::int64_t j) {
  const std::int64_t t = a.begin + j, S = a.seq_len;
  const bool past_end = t >= S;
  const bool padding = past_end || (a.mask != nullptr && a.mask[row * a.mask_pitch + t] == 0);
  std::int64_t position = t;
  if (a.positions != nullptr) {
    const std::int64_t* given = a.positions + row * a.positions_pitch;
    position = past_end ? given[S - 1] + (t - S + 1) : given[t];  // right padding continues
  }
  const std::int64_t label =
      sharded_label(padding, past_end ? kIgnoreLabel : a.labels[row * a.labels_pitch + t]);
  const std::int64_t out = row * a.out_pitch + j;
  a.position[out] = position;
  a.document[out] = past_end ? 0 : 1;
  a.padding[out] = padding;
  a.label[out] = label;
  a.valid[out] = is_valid_target(padding, label, t);
}

void bshd_layout_cpu(const BshdLayoutArgs& args);
// Enqueues on `stream` (a cudaStream_t). CUDA builds only.
void bshd_layout_cuda(const BshdLayoutArgs& args, void* stream);

}  // namespace cpkit::kernels
