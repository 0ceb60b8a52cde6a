// The arithmetic of token_logprobs (docs/spec.md section 5b), written once for the CPU and
// CUDA kernels (__host__ __device__ under nvcc) and tested on the CPU. Plain C++.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cross_entropy.hpp"
#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// Online statistics of a row of logits z: max, sum of e_i = exp(z_i - max) and the sum of
// e_i (z_i - max). Kept relative to the max, the entropy log(sum) - centred / sum is a
// difference of O(log V) terms, never of two |z|-sized ones.
struct LogprobStats {
  float max;
  float sum;
  float centred;
};

CPKIT_HOST_DEVICE inline LogprobStats logprob_empty() { return {-INFINITY, 0.0f, 0.0f}; }

// A block's statistics from its max m and, over its entries, s = sum exp(z - m) and
// c = sum exp(z - m) (z - m), merged into a running state. Masked logits (-inf) add 0.
CPKIT_HOST_DEVICE inline LogprobStats logprob_merge(LogprobStats a, LogprobStats b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = a.max > b.max ? a.max : b.max;
  const float da = a.max - m, db = b.max - m;  // <= 0
  const float fa = fast_exp(da), fb = fast_exp(db);
  return {m, a.sum * fa + b.sum * fb,
          fa * (a.centred + da * a.sum) + fb * (b.centred + db * b.sum)};
}

// One logit into a running state (a thread's strided share of a row on the GPU).
CPKIT_HOST_DEVICE inline void logprob_add(LogprobStats& s, float z) {
  if (z == -INFINITY) return;  // masked: adds 0 to both sums
  if (s.max == -INFINITY) {
    s = {z, 1.0f, 0.0f};
  } else if (z > s.max) {
    const float d = s.max - z;  // < 0: the state's terms move to the new max
    const float f = fast_exp(d);
    s.centred = f * (s.centred + d * s.sum);
    s.sum = s.sum * f + 1.0f;
    s.max = z;
  } else {
    const float d = z - s.max;
    const float e = fast_exp(d);
    s.sum += e;
    s.centred += e * d;
  }
}

// One logit's e (z - m) term: 0 for a masked logit, whose e is 0 and z - m is -inf.
CPKIT_HOST_DEVICE inline float centred_term(float e, float d) { return e > 0.0f ? e * d : 0.0f; }

// The logit the distribution is taken over: the model's cap, then the sampler's temperature.
template <bool kCapped>
CPKIT_HOST_DEVICE inline float tempered(float y, float softcap, float inv_temperature) {
  return capped<kCapped>(y, softcap) * inv_temperature;
}

// What a position's backward needs: the row's max, log-sum (log sum exp(z - max)) and the
// softmax mean of z - max. Saved by the forward, three floats a position.
struct RowStats {
  float max;
  float log_sum;
  float mean_centred;
};

CPKIT_HOST_DEVICE inline RowStats row_stats(LogprobStats s) {
  return {s.max, logf(s.sum), s.centred / s.sum};
}

// log p(target) = (z_t - max) - log_sum <= 0: both terms have their sign exactly.
CPKIT_HOST_DEVICE inline float logprob_value(float z_target, RowStats r) {
  return (z_target - r.max) - r.log_sum;
}

// H = log_sum - mean(z - max) >= 0: mean(z - max) <= 0.
CPKIT_HOST_DEVICE inline float entropy_value(RowStats r) { return r.log_sum - r.mean_centred; }

// d(g_lp * logprob + g_ent * entropy) / d y for one raw head output y:
// dz = g_lp (onehot - p) - g_ent p (z - mean z), then through 1 / t and the cap's 1 - tanh^2.
// A masked logit (p = 0) gets 0 (never 0 * -inf). kCapped = false: no cap (softcap <= 0).
// kEntropy = false: no entropy upstream (g_ent is 0; its term is not computed).
template <bool kCapped, bool kEntropy = true>
CPKIT_HOST_DEVICE inline float logprob_grad(float y, bool is_target, RowStats r, float g_lp,
                                            float g_ent, float softcap, float inv_temperature) {
  const float t = kCapped ? fast_tanh(over_cap(y, softcap)) : 0.0f;
  const float z = (kCapped ? softcap * t : y) * inv_temperature;
  const float d = z - r.max;
  const float p = fast_exp(d - r.log_sum);
  const float onehot = is_target ? 1.0f : 0.0f;
  float dz = g_lp * (onehot - p);
  if constexpr (kEntropy) dz -= p > 0.0f ? g_ent * p * (d - r.mean_centred) : 0.0f;
  return dz * inv_temperature * (kCapped ? 1.0f - t * t : 1.0f);
}

}  // namespace cpkit::kernels
