// How a bf16 LM head's logits are computed (docs/spec.md section 5b): rounded to the inputs'
// dtype, as Hugging Face's eager path does, or kept at the GEMM's fp32 accumulation.
#pragma once

#include <string>

namespace cpkit {

enum class LogitsPrecision {
  kInput,  // logits and the logit gradient rounded to bf16 (HF's logits.float() numerics)
  kFp32,   // products and sums in fp32, never rounded to bf16 before the outputs
};

// "input" or "fp32"; anything else is an error naming logits_precision.
LogitsPrecision parse_logits_precision(const std::string& name);

}  // namespace cpkit
