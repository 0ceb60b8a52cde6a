// Raw-pointer entry points of the token_logprobs kernels (plain C++ header, safe for nvcc).
// The forward reduces each row of raw head outputs to its statistics and values; the backward
// turns a row into d(g_lp * logprob + g_ent * entropy) / d y, in place when grad == logits.
#pragma once

#include <cstdint>

namespace cpkit::kernels {

struct TokenLogprobsArgs {
  const float* logits;          // [rows, vocab] raw head outputs y, contiguous (or [vocab, rows])
  const std::int64_t* targets;  // [rows], kIgnoreLabel = no target
  std::int64_t rows;
  std::int64_t vocab;
  float softcap;               // <= 0: off
  float inv_temperature;       // 1 / t
  float* stats;                // [rows, 3] RowStats: written by the forward, read by the backward
  float* logprobs;             // [rows] forward output, 0 where no target
  float* entropy;              // [rows] forward output, or null (not asked for)
  const float* grad_logprobs;  // [rows] backward upstream, or null (zero)
  const float* grad_entropy;   // [rows] backward upstream, or null (zero)
  float* grad;                 // as logits, the backward output; may be `logits` itself
  bool vocab_major;            // logits and grad [vocab, rows]: the fused head's CPU layout
  // The forward saves each row's centred mean (what the entropy and its gradient need; the
  // CPU kernel skips that sum when false and entropy is null, saving 0). Every caller whose
  // saved stats may meet an entropy upstream later keeps it true.
  bool centred = true;
};

void token_logprobs_forward_cpu(const TokenLogprobsArgs& args);
void token_logprobs_backward_cpu(const TokenLogprobsArgs& args);
// Enqueue on `stream` (a cudaStream_t); defined only when CUDA is built. Row-major only.
void token_logprobs_forward_cuda(const TokenLogprobsArgs& args, void* stream);
void token_logprobs_backward_cuda(const TokenLogprobsArgs& args, void* stream);

}  // namespace cpkit::kernels
