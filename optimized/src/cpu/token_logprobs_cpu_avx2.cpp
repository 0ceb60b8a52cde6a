// The CPU token_logprobs rows built with AVX2 + FMA (this file's compile flags).
#define CPKIT_ROWS_NAMESPACE avx2
#include "cpu/token_logprobs_rows.hpp"

namespace cpkit::kernels {

void token_logprobs_forward_avx2(const TokenLogprobsArgs& a, std::int64_t begin, std::int64_t end) {
  avx2::run_forward(a, begin, end);
}

void token_logprobs_backward_avx2(const TokenLogprobsArgs& a, std::int64_t begin,
                                  std::int64_t end) {
  avx2::run_backward(a, begin, end);
}

}  // namespace cpkit::kernels
