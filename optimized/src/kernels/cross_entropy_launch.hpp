// Raw-pointer entry points of the fused cross-entropy kernels (plain C++ header, safe for
// nvcc): loss per row and d(scale * CE)/d logits in one kernel, scale = CP / N.
#pragma once

#include <cstdint>

#include "kernels/cluster_plan.hpp"

namespace cpkit::kernels {

struct CrossEntropyArgs {
  const float* logits;          // [rows, vocab], contiguous (or [vocab, rows]: vocab_major)
  const std::int64_t* targets;  // [rows], kIgnoreLabel = no target
  std::int64_t rows;
  std::int64_t vocab;
  float softcap;              // <= 0: off
  int cp;                     // CP size
  const std::int64_t* count;  // N, the global target count, on the kernel's device; the
                              // kernel forms CP / N itself (no host synchronisation)
  float* grad;                // as logits; may be `logits` itself (computed in place)
  float* row_loss;            // [rows], unscaled CE, 0 where no target
  float* scale;               // [1]: the loss_scale(cp, N) the gradient carries
  bool vocab_major;           // logits and grad [vocab, rows]: the fused head's CPU layout
};

void cross_entropy_cpu(const CrossEntropyArgs& args);
// Enqueues on `stream` (a cudaStream_t); defined only when CUDA is built. Takes the two-pass
// kernel unless the cluster kernel is asked for (kernels/cluster_plan.hpp). Row-major only.
void cross_entropy_cuda(const CrossEntropyArgs& args, void* stream);
// Process-wide choice (tests and benchmarks): kAuto and kTwoPass take the two-pass kernel;
// kCluster raises where the device or the vocabulary does not allow it. CUDA builds only.
void set_cuda_cross_entropy_kernel(CrossEntropyKernel kernel);

}  // namespace cpkit::kernels
