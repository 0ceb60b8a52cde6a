// cp_attention's per-key arithmetic, written once for the CPU and CUDA kernels (plain C++
// header, safe for nvcc) and so tested on the CPU: the score with its optional soft cap, and
// one online-softmax step.
#pragma once

#include <cmath>

#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// A key's score and d score / d (scale q.k), the soft cap's chain rule (1 without a cap).
struct AttentionScore {
  float value, slope;
};

CPKIT_HOST_DEVICE inline AttentionScore attention_score(float q_dot_k, float scale, float softcap) {
  const float s = q_dot_k * scale;
  if (softcap <= 0.0f) return {s, 1.0f};
  const float t = tanhf(s / softcap);
  return {softcap * t, 1.0f - t * t};
}

// A running softmax over the keys seen so far: max m and sum l of exp(score - m). A sink
// starts it at (sink, 1); nothing seen is (-inf, 0).
struct OnlineRow {
  float max, sum;
};

// Moves the row's max up to `m` if it is larger: returns the factor the running sum and the
// running weighted sum of values are multiplied by (1 when the max did not move, 0 when
// nothing was seen). One key's step, or one block of keys' (m = the block's max).
CPKIT_HOST_DEVICE inline float online_rescale(OnlineRow& row, float m) {
  if (!(m > row.max)) return 1.0f;
  const float shrink = expf(row.max - m);  // 0 when the max was -inf
  row.sum *= shrink;
  row.max = m;
  return shrink;
}

// Takes score s in: returns online_rescale's factor and leaves exp(s - max) in `p`.
CPKIT_HOST_DEVICE inline float online_step(OnlineRow& row, float s, float& p) {
  const float shrink = online_rescale(row, s);
  p = expf(s - row.max);
  row.sum += p;
  return shrink;
}

}  // namespace cpkit::kernels
