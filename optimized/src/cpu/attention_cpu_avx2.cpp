// The CPU cp_attention tiles built with AVX2 + FMA (this file's compile flags).
#define CPKIT_ROWS_NAMESPACE avx2
#include "cpu/attention_tiles.hpp"

namespace cpkit::kernels {

void attention_forward_avx2(const AttentionArgs& a) { avx2::run_attention_forward(a); }

void attention_backward_avx2(const AttentionArgs& a) { avx2::run_attention_backward(a); }

}  // namespace cpkit::kernels
