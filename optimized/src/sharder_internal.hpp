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
  std::shared_ptr<const LayoutPlan> plan;  // which rank owns which of its tokens
};

namespace detail {

// Streams of a rank's shard, from the global sequence (positions, padding, valid, ...).
void fill_bshd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                       LocalShard& shard);
void fill_thd_streams(const CPBatch& batch, const Sharder::Microbatch& mb, const Layout& l,
                      LocalShard& shard);

// After a host pass over a batch on another device (a build without the CUDA kernels): the
// five streams moved to that device.
inline void move_streams(LocalShard& shard, const at::Device& device) {
  if (device.is_cpu()) return;
  for (at::Tensor* t :
       {&shard.document_ids, &shard.position_ids, &shard.padding, &shard.labels, &shard.valid})
    *t = t->to(device);
}

void check_common(const CPBatch& batch, int cp_size, int num_chunks, const PadOptions& pad);
std::vector<Sharder::Microbatch> bshd_microbatches(const CPBatch& batch, int cp_size,
                                                   int num_chunks, const PadOptions& pad);
std::vector<Sharder::Microbatch> thd_microbatches(const CPBatch& batch, int cp_size, int num_chunks,
                                                  const PadOptions& pad);

// Every CP rank must shard the same global batch with the same options (batch_agreement.cpp):
// one exchange of the shapes, options and, under the value checks, checksums of the integer
// streams; a difference raises on every rank.
void check_batch_agrees(const CPBatch& batch, const MeshPtr& mesh, int num_chunks,
                        const PadOptions& pad);

}  // namespace detail
}  // namespace cpkit
