// How a row of floats splits for 16-byte vector loads (plain C++ header, safe for nvcc),
// shared by every CUDA kernel that streams rows and tested on the CPU.
#pragma once

#include <cstdint>

#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// A row of n floats at byte address `address` (a multiple of 4), split for 16-byte loads:
// `head` scalars up to the first 16-byte boundary, `quads` aligned float4s, `tail` scalars.
// Rows of any V (50257 as well as 131072) then take vector loads for all but <= 6 logits.
struct VectorSpan {
  std::int64_t head, quads, tail;
};

CPKIT_HOST_DEVICE inline VectorSpan vector_span(std::uintptr_t address, std::int64_t n) {
  std::int64_t head = static_cast<std::int64_t>((16 - address % 16) % 16 / 4);
  head = head < n ? head : n;
  const std::int64_t quads = (n - head) / 4;
  return {head, quads, n - head - 4 * quads};
}

}  // namespace cpkit::kernels
