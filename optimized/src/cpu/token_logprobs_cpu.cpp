// CPU kernels of token_logprobs, run as row_dispatch.hpp says.
#include <ATen/Parallel.h>

#define CPKIT_ROWS_NAMESPACE baseline
#include "cpu/row_dispatch.hpp"
#include "cpu/token_logprobs_rows.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void token_logprobs_forward_avx2(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end);
void token_logprobs_backward_avx2(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end);
#endif

void token_logprobs_forward_cpu(const TokenLogprobsArgs& a) {
  at::parallel_for(0, a.rows, row_grain(a.vocab), [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) return token_logprobs_forward_avx2(a, begin, end);
#endif
    baseline::run_forward(a, begin, end);
  });
}

void token_logprobs_backward_cpu(const TokenLogprobsArgs& a) {
  at::parallel_for(0, a.rows, row_grain(a.vocab), [&](std::int64_t begin, std::int64_t end) {
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) return token_logprobs_backward_avx2(a, begin, end);
#endif
    baseline::run_backward(a, begin, end);
  });
}

}  // namespace cpkit::kernels
