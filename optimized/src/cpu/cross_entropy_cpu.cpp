// CPU kernel of the fused shifted cross-entropy, run as row_dispatch.hpp says.
#include <ATen/Parallel.h>

#define CPKIT_ROWS_NAMESPACE baseline
#include "cpu/cross_entropy_columns.hpp"
#include "cpu/cross_entropy_rows.hpp"
#include "cpu/row_dispatch.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void cross_entropy_rows_avx2(const CrossEntropyArgs& a, float scale, std::int64_t begin,
                             std::int64_t end);
void cross_entropy_columns_avx2(const CrossEntropyArgs& a, float scale);
#endif

void cross_entropy_cpu(const CrossEntropyArgs& a) {
  const float scale = loss_scale(a.cp, *a.count);
  *a.scale = scale;
  if (a.vocab_major) {
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) return cross_entropy_columns_avx2(a, scale);
#endif
    return baseline::run_columns(a, scale);
  }
  at::parallel_for(0, a.rows, row_grain(a.vocab), [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) return cross_entropy_rows_avx2(a, scale, begin, end);
#endif
    baseline::run_rows(a, scale, begin, end);
  });
}

}  // namespace cpkit::kernels
