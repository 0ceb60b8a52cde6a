// CPU kernel of the fused shifted cross-entropy: rows in parallel, the AVX2 + FMA build of
// the row loops where the CPU has them, the baseline build otherwise.
#include <ATen/Parallel.h>

#define CPKIT_ROWS_NAMESPACE baseline
#include "cpu/cross_entropy_rows.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void cross_entropy_rows_avx2(const CrossEntropyArgs& a, float scale, std::int64_t begin,
                             std::int64_t end);
#endif

void cross_entropy_cpu(const CrossEntropyArgs& a) {
  const float scale = loss_scale(a.cp, *a.count);
  *a.scale = scale;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  constexpr bool avx2 = false;
#endif
  // Rows are independent and each is written by one thread: results do not depend on the
  // thread count.
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, a.vocab));
  at::parallel_for(0, a.rows, grain, [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (avx2) return cross_entropy_rows_avx2(a, scale, begin, end);
#endif
    baseline::run_rows(a, scale, begin, end);
  });
}

}  // namespace cpkit::kernels
