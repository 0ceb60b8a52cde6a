// The values a rank publishes in an agreement exchange (agreement.hpp), written into its
// row on the exchange's device (plain C++ header, safe for nvcc). On CUDA the values travel
// as a kernel argument: no copy from pageable host memory (which may synchronise, and is
// illegal inside CUDA-graph capture); a captured graph bakes them in like the shapes they
// describe.
#pragma once

#include <cstdint>

namespace cpkit::kernels {

constexpr int kMaxAgreedValues = 16;

struct AgreedRow {
  std::int64_t values[kMaxAgreedValues];
  int count;
};

// dst[0, row.count) = row.values. Enqueues on `stream` (a cudaStream_t). CUDA builds only.
void write_agreed_row_cuda(std::int64_t* dst, const AgreedRow& row, void* stream);

}  // namespace cpkit::kernels
