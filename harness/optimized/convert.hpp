// Eigen (reference) <-> at::Tensor (optimized), for feeding both the same inputs.
#pragma once

#include <ATen/ATen.h>

#include "cpkit/optimized/batch.hpp"
#include "cpkit/reference/reference.hpp"

namespace cpkit::harness {

at::Tensor to_tensor(const reference::IntMatrix& m);
at::Tensor to_tensor(const reference::BoolMatrix& m);
at::Tensor to_tensor(const reference::FloatMatrix& m);
at::Tensor to_tensor(const reference::BoolVector& v);
at::Tensor to_tensor(const reference::FloatRows& rows);  // [B, S, H]
at::Tensor to_tensor(const reference::IntVector& v);

CPBatch to_cp_batch(const reference::BshdBatch& b);
CPBatch to_cp_batch(const reference::PackedBatch& b);

}  // namespace cpkit::harness
