// What the Sharder keeps per microbatch, and the per-format local-stream builders.
#pragma once

#include <ATen/ATen.h>

#include "cpkit/optimized/sharder.hpp"

namespace cpkit {

struct Sharder::Microbatch {
  std::int64_t first_row = 0;
  std::int64_t rows = 0;
  std::int64_t seq_len = 0;
  bool packed = false;
  // THD only, CPU int64: real lengths [docs], offsets [docs + 1].
  at::Tensor lens, cu_lens, cu_padded;
};

namespace detail {

// Streams of a rank's shard, from the global sequence (positions, padding, valid, ...).
void fill_bshd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                       LocalShard& shard);
void fill_thd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                      LocalShard& shard);

void check_common(const CPBatch& batch, int cp_size, int num_chunks, const PadOptions& pad);
std::vector<Sharder::Microbatch> bshd_microbatches(const CPBatch& batch, int cp_size,
                                                   int num_chunks, const PadOptions& pad);
std::vector<Sharder::Microbatch> thd_microbatches(const CPBatch& batch, int cp_size, int num_chunks,
                                                  const PadOptions& pad);

}  // namespace detail
}  // namespace cpkit
