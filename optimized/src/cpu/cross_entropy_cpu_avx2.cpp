// The CPU cross-entropy rows built with AVX2 + FMA (this file's compile flags).
#define CPKIT_ROWS_NAMESPACE avx2
#include "cpu/cross_entropy_columns.hpp"
#include "cpu/cross_entropy_rows.hpp"

namespace cpkit::kernels {

void cross_entropy_rows_avx2(const CrossEntropyArgs& a, float scale, std::int64_t begin,
                             std::int64_t end) {
  avx2::run_rows(a, scale, begin, end);
}

void cross_entropy_columns_avx2(const CrossEntropyArgs& a, float scale) {
  avx2::run_columns(a, scale);
}

}  // namespace cpkit::kernels
