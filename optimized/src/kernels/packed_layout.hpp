// Per-token metadata of a packed row, written once for the CPU loop and the CUDA kernel.
#pragma once

#include <cstdint>

#include "kernels/host_device.hpp"

namespace cpkit::kernels {

struct PackedToken {
  std::int64_t document;  // 1-based slot index, 0 past the last slot
  std::int64_t position;  // offset within the slot, 0 past the last slot
  bool padding;           // slot padding or row tail
};

// cu_padded: [docs + 1] prefix sums of slot lengths; lens: [docs] real lengths.
CPKIT_HOST_DEVICE inline PackedToken packed_token(std::int64_t t, const std::int64_t* cu_padded,
                                                  const std::int64_t* lens, std::int64_t docs) {
  if (t >= cu_padded[docs]) return {0, 0, true};
  // The last slot starting at or before t holds it (zero-length slots before it share its
  // start and are skipped).
  std::int64_t lo = 0, hi = docs - 1;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (cu_padded[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const std::int64_t offset = t - cu_padded[lo];
  return {lo + 1, offset, offset >= lens[lo]};
}

// Tokens t0, t0 + 1, ... in increasing order on the host: one binary search (packed_token)
// for the first, then a walk over slot starts under the same rule, O(1) per token.
class PackedWalk {
 public:
  PackedWalk(std::int64_t t0, const std::int64_t* cu_padded, const std::int64_t* lens,
             std::int64_t docs)
      : cu_(cu_padded), lens_(lens), docs_(docs) {
    const std::int64_t first = packed_token(t0, cu_padded, lens, docs).document;
    slot_ = first > 0 ? first - 1 : docs - 1;
  }

  // t must not decrease from one call to the next (and start at t0 or later).
  PackedToken at(std::int64_t t) {
    if (t >= cu_[docs_]) return {0, 0, true};
    while (slot_ + 1 < docs_ && cu_[slot_ + 1] <= t) ++slot_;
    const std::int64_t offset = t - cu_[slot_];
    return {slot_ + 1, offset, offset >= lens_[slot_]};
  }

 private:
  const std::int64_t* cu_;
  const std::int64_t* lens_;
  std::int64_t docs_;
  std::int64_t slot_;
};

}  // namespace cpkit::kernels
