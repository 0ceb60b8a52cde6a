// Raw-pointer entry point of the packed-layout kernel (plain C++ header, safe for nvcc).
#pragma once

#include <cstdint>

namespace cpkit::kernels {

struct PackedLayoutArgs {
  const std::int64_t* cu_padded;  // [docs + 1], on the kernel's device
  const std::int64_t* lens;       // [docs]
  std::int64_t docs;
  std::int64_t begin;      // first global token of the shard
  std::int64_t count;      // tokens in the shard
  std::int64_t* document;  // [count]
  std::int64_t* position;  // [count]
  bool* padding;           // [count]
};

void packed_layout_cuda(const PackedLayoutArgs& args, void* stream);

}  // namespace cpkit::kernels
