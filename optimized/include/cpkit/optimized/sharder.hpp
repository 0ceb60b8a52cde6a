// prepare_cp_inputs / prepare_packed_cp_inputs and the Sharder they return: each rank's
// local tensors, with every value taken from the global sequence before the cut.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "cpkit/optimized/batch.hpp"
#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/offsets.hpp"

namespace cpkit {

// One rank's place in a microbatch's layout (layout.hpp, docs/spec.md section 2b).
struct Layout {
  int cp_size = 1;
  int rank = 0;
  std::int64_t seq_len = 0;                // S (or T) as given
  std::int64_t padded_len = 0;             // S_pad
  std::int64_t local_len = 0;              // L = S_pad / CP
  std::vector<Fragment> fragments;         // this rank's global ranges, in local order
  std::shared_ptr<const LayoutPlan> plan;  // every rank's: the losses' halo, restore_order
};

// Rank `rank`'s Layout in `plan`.
Layout layout_of(const std::shared_ptr<const LayoutPlan>& plan, int rank);

struct LocalShard {
  Layout layout;
  at::Tensor input_ids;      // [rows, L] when shard_primary and ids were given
  at::Tensor inputs_embeds;  // [rows, L, H] when shard_primary and embeddings were given
  at::Tensor labels;         // [rows, L] int64, -100 on padding
  at::Tensor position_ids;   // [rows, L] int64
  at::Tensor document_ids;   // [rows, L] int64
  at::Tensor padding;        // [rows, L] bool
  at::Tensor valid;          // [rows * L] bool, the loss's valid-target mask
};

class Sharder {
 public:
  struct Microbatch;  // internal

  Sharder(CPBatch batch, MeshPtr mesh, int cp_size, bool shard_primary, PadOptions pad,
          std::vector<Microbatch> microbatches);
  ~Sharder();
  Sharder(Sharder&&) noexcept;
  Sharder& operator=(Sharder&&) noexcept;

  int cp_size() const { return cp_size_; }
  int rank() const { return cp_rank(mesh_); }
  int num_microbatches() const;
  const std::vector<at::Tensor>& images() const { return batch_.images; }

  Layout layout(int microbatch, int rank) const;
  LocalShard local(int microbatch) const { return local(microbatch, rank()); }
  // Any rank's shard (tools and tests that look at all ranks from one process).
  LocalShard local(int microbatch, int rank) const;

  // shard_primary == false: the microbatch's primary stream, global and unpadded.
  at::Tensor global_primary(int microbatch) const;
  // Cuts the model's spliced [rows, S, H] embeddings (or [rows, S] ids) of one microbatch
  // like every other stream. Differentiable: backward places the local gradient on this
  // rank's rows of a zero [rows, S, H] gradient.
  at::Tensor cut_spliced(int microbatch, const at::Tensor& spliced) const {
    return cut_spliced(microbatch, rank(), spliced);
  }
  at::Tensor cut_spliced(int microbatch, int rank, const at::Tensor& spliced) const;

  // THD: offsets over real lengths / slot lengths of the microbatch's documents, [D + 1].
  at::Tensor cu_seqlens(int microbatch) const;
  at::Tensor cu_seqlens_padded(int microbatch) const;

  // Varlen attention offsets of this rank's shard (offsets.hpp, docs/spec.md section 4a).
  AttentionOffsets attention_offsets(int microbatch) const {
    return cpkit::attention_offsets(*this, microbatch, rank());
  }

 private:
  friend AttentionOffsets attention_offsets(const Sharder& sharder, int microbatch, int rank);
  const Microbatch& microbatch(int index) const;
  void check_rank(int rank) const;

  CPBatch batch_;
  MeshPtr mesh_;
  int cp_size_;
  bool shard_primary_;
  PadOptions pad_;
  std::vector<Microbatch> microbatches_;
};

// The layout of `rank`'s shard of a sequence of `seq_len` tokens (docs/spec.md sections 2
// and 2b; `balanced` needs document lengths: plan_balanced).
Layout shard_layout(std::int64_t seq_len, int cp_size, int rank, int pad_multiple = 1,
                    LayoutKind kind = LayoutKind::kContiguous);

// The padded cut without autograd, for autograd systems that register the backward
// themselves (the Python package; Sharder::cut_spliced uses the same two):
// x[rows, S, ...] -> [rows, L, ...] holding the layout's fragments' columns, `fill` past S;
// and its backward, the local gradient on those columns of a zero [rows, S, ...] gradient.
at::Tensor cut_columns(const at::Tensor& x, const Layout& layout, double fill);
// Raises unless `spliced` is [rows, layout.seq_len, ...] (the one check of both front doors).
void check_spliced(const at::Tensor& spliced, std::int64_t rows, const Layout& layout);
at::Tensor cut_columns_backward(const at::Tensor& grad, const Layout& layout);

// BSHD (qkv_format "bshd"): num_chunks splits the batch axis.
Sharder prepare_cp_inputs(const CPBatch& batch, const MeshPtr& mesh, int num_chunks = 1,
                          bool shard_primary = true, const PadOptions& pad = {});
// THD (qkv_format "thd"): one packed row per microbatch, so num_chunks rows.
Sharder prepare_packed_cp_inputs(const CPBatch& batch, const MeshPtr& mesh, int num_chunks,
                                 bool shard_primary = true, const PadOptions& pad = {});

// The same with an explicit CP size and no mesh: all ranks' shards from one process.
Sharder prepare_cp_inputs_for(const CPBatch& batch, int cp_size, int num_chunks = 1,
                              bool shard_primary = true, const PadOptions& pad = {});
Sharder prepare_packed_cp_inputs_for(const CPBatch& batch, int cp_size, int num_chunks,
                                     bool shard_primary = true, const PadOptions& pad = {});

}  // namespace cpkit
