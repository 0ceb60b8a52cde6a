// Eigen (reference) <-> at::Tensor (optimized), for feeding both the same inputs.
#pragma once

#include <ATen/ATen.h>

#include "cpkit/optimized/batch.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/reference/reference.hpp"

namespace cpkit::harness {

at::Tensor to_tensor(const reference::IntMatrix& m);
at::Tensor to_tensor(const reference::BoolMatrix& m);
at::Tensor to_tensor(const reference::FloatMatrix& m);
at::Tensor to_tensor(const reference::BoolVector& v);
at::Tensor to_tensor(const reference::FloatRows& rows);  // [B, S, H]
at::Tensor to_tensor(const reference::IntVector& v);

// The global positions of a shard's local tokens, as an int64 tensor (index_select of global
// per-token values gives the shard's).
at::Tensor layout_positions_of(const Layout& layout);
// Every rank's positions under the reference's layout of microbatch m (empty: contiguous),
// for reference::LossOptions::layout.
reference::LayoutPositions reference_layout(const reference::Sharder& s, int m);

// The optimized side's padding and layout options of a case (its ShardOptions).
PadOptions pad_of(const reference::ShardOptions& o);

CPBatch to_cp_batch(const reference::BshdBatch& b);
CPBatch to_cp_batch(const reference::PackedBatch& b);

}  // namespace cpkit::harness
