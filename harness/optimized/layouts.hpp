// Memory layouts for inputs and upstream gradients: the same values with the strides a
// trainer's tensors really have (an attention layer's dK/dV is usually a transpose), so no
// operation may read a tensor through a raw pointer as if it were contiguous.
#pragma once

#include <ATen/ATen.h>
#include <rapidcheck.h>

#include "cpkit/reference/types.hpp"

namespace cpkit::harness {

enum class MemoryLayout : int { kContiguous, kTransposed, kSliced, kExpanded };

rc::Gen<MemoryLayout> gen_memory_layout();
const char* layout_name(MemoryLayout layout);
void showValue(MemoryLayout layout, std::ostream& os);

// For tensors whose values are given (their rows differ): kExpanded becomes kSliced.
MemoryLayout strided(MemoryLayout layout);

// [rows, cols] N(0, 1) values from `seed`; kExpanded repeats one row (the only values an
// expanded tensor can hold).
reference::FloatMatrix layout_values(Eigen::Index rows, Eigen::Index cols, MemoryLayout layout,
                                     std::uint64_t seed);

// `t` (1-D to 3-D) with the same values and `layout`'s strides: kTransposed swaps the first
// two axes in memory, kSliced takes every other element of a buffer whose other half is
// `junk`, kExpanded broadcasts the first row (its rows must be equal). 1-D tensors take
// kSliced for kTransposed.
at::Tensor lay_out(const at::Tensor& t, MemoryLayout layout, double junk);

}  // namespace cpkit::harness
