// How the CPU kernels over rows of logits run (internal header): rows in parallel, each written
// by one thread (results do not depend on the thread count), at least ~32K logits per task,
// and the AVX2 + FMA build of the row loops where the CPU has it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cpkit::kernels {

inline std::int64_t row_grain(std::int64_t vocab) {
  return std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, vocab));
}

inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
#else
  return false;
#endif
}

}  // namespace cpkit::kernels
