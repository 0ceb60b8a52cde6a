// The LM head's three GEMMs over chunks of token rows, in the precision asked for (internal
// header): what shifted_cp_linear_loss and token_logprobs share around their kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cpkit/optimized/logits_precision.hpp"

namespace cpkit::detail {

// The checks both fused-head ops make: hidden [B, L, H] and weight [V, H] of one dtype
// (float32 or bfloat16) and device, V >= 2; chunk_rows >= 0; softcap as section 5.
void check_head_inputs(const at::Tensor& hidden, const at::Tensor& weight, double softcap,
                       int64_t chunk_rows);

// Whether logits z [n, V] (a kernel's input and in-place output) are stored vocab-major
// (z^T contiguous: token r's logit v at v * n + r, the fused head's CPU layout) rather than
// row-major; raises naming `name` for any other layout and for vocab-major CUDA logits.
bool vocab_major(const at::Tensor& z, const char* name);

// Each op's CPU budget of fp32 logits for its default chunk (docs/performance.md, "Chunk
// size"): the SFT loss meets its time and memory targets together at 128 MiB (256 rows at
// V 131072); the policy loss (and token_logprobs, its no-grad pass) needs 256 MiB for its
// time and GEMM-throughput targets.
constexpr int64_t kLossCpuChunkBytes = int64_t{128} << 20;
constexpr int64_t kLogprobCpuChunkBytes = int64_t{256} << 20;

// The default chunk: as many rows as fit `cpu_budget` bytes of fp32 logits and at most 512
// (CPU tensors) or 1 GiB (CUDA tensors), rounded down to a multiple of 64 rows when that is at
// least 64, never more than `rows`, at least 1.
int64_t default_chunk_rows(int64_t vocab, int64_t rows, bool cuda, int64_t cpu_budget);

class HeadGemms {
 public:
  // hidden [rows, H] and weight [V, H], checked; chunk_rows: the option (0: the default rule
  // with `cpu_budget`). A
  // bf16 head under LogitsPrecision::kFp32 is upcast once per call (exact: every bf16 value is an
  // fp32 value), so its products and sums are fp32 GEMMs: V * H * 4 bytes more than the bf16 head.
  HeadGemms(const at::Tensor& hidden, const at::Tensor& weight, LogitsPrecision precision,
            int64_t chunk_rows, int64_t cpu_budget);

  int64_t chunk() const { return chunk_; }

  // The fp32 logits [n, V] of rows [begin, begin + n), n <= chunk(), in the one chunk buffer
  // every call reuses. Vocab-major on the CPU: MKL writes the [V, n] product ~25 % faster
  // than [n, V] at LM-head shapes (bench/head_bench.py), and the kernels read either layout.
  at::Tensor logits(int64_t begin, int64_t n) const;
  // The logit gradient g (fp32 [n, V]) as both gradient GEMMs take it: g itself, or rounded
  // to bf16 (kInput: what autograd of HF's logits.float() hands the head's matmul).
  at::Tensor gradient_operand(const at::Tensor& g) const;
  // out (hidden's dtype, [n, H]) = g @ weight.
  void grad_hidden(const at::Tensor& g, const at::Tensor& out) const;
  // fp32 acc [V, H] = (first) or += g^T @ rows [begin, begin + n) of hidden.
  void accumulate_grad_weight(const at::Tensor& acc, const at::Tensor& g, int64_t begin,
                              bool first) const;

 private:
  at::Tensor hidden_;  // [rows, H] as the GEMMs read it (fp32 when round_ is false)
  at::Tensor weight_;  // [V, H] likewise
  bool round_;         // a bf16 head under kInput: bf16 GEMMs, logits rounded to bf16
  int64_t chunk_;
  bool vocab_major_;
  at::Tensor buffer_;  // chunk_ * V floats
};

}  // namespace cpkit::detail
