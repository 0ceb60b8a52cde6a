// The CPU token_logprobs loops built with AVX2 + FMA (this file's compile flags).
#define CPKIT_ROWS_NAMESPACE avx2
#include "cpu/token_logprobs_columns.hpp"

namespace cpkit::kernels {

void token_logprobs_forward_avx2(const TokenLogprobsArgs& a) { avx2::run_forward_columns(a); }

void token_logprobs_backward_avx2(const TokenLogprobsArgs& a) { avx2::run_backward_columns(a); }

}  // namespace cpkit::kernels
