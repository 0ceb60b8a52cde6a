// cp_attention's CPU kernels (kernels/attention_launch.hpp): the tiles of cpu/attention_tiles.hpp,
// in the AVX2 + FMA build where the CPU has it (row_dispatch.hpp).
#define CPKIT_ROWS_NAMESPACE baseline
#include "cpu/attention_tiles.hpp"
#include "cpu/row_dispatch.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void attention_forward_avx2(const AttentionArgs& a);
void attention_backward_avx2(const AttentionArgs& a);
#endif

void attention_forward_cpu(const AttentionArgs& a) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return attention_forward_avx2(a);
#endif
  baseline::run_attention_forward(a);
}

void attention_backward_cpu(const AttentionArgs& a) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return attention_backward_avx2(a);
#endif
  baseline::run_attention_backward(a);
}

}  // namespace cpkit::kernels
