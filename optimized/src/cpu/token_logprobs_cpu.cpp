// CPU kernels of token_logprobs on vocab-major logits (the fused head's CPU layout,
// cpu/vocab_major.hpp), in the AVX2 + FMA build where the CPU has it (row_dispatch.hpp).
#define CPKIT_ROWS_NAMESPACE baseline
#include "cpkit/optimized/error.hpp"
#include "cpu/row_dispatch.hpp"
#include "cpu/token_logprobs_columns.hpp"

namespace cpkit::kernels {

#if defined(__x86_64__)
void token_logprobs_forward_avx2(const TokenLogprobsArgs& a);
void token_logprobs_backward_avx2(const TokenLogprobsArgs& a);
#endif

namespace {

void require_vocab_major(const TokenLogprobsArgs& a) {
  if (!a.vocab_major && a.rows > 1)
    raise("logits", "the CPU token_logprobs kernels read vocab-major logits [V, rows]");
}

}  // namespace

void token_logprobs_forward_cpu(const TokenLogprobsArgs& a) {
  require_vocab_major(a);
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return token_logprobs_forward_avx2(a);
#endif
  baseline::run_forward_columns(a);
}

void token_logprobs_backward_cpu(const TokenLogprobsArgs& a) {
  require_vocab_major(a);
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return token_logprobs_backward_avx2(a);
#endif
  baseline::run_backward_columns(a);
}

}  // namespace cpkit::kernels
