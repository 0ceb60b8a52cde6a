// The arithmetic of the fused shifted cross-entropy, written once for the CPU kernel and the
// CUDA kernel (compiled as __host__ __device__ by nvcc), so CPU tests exercise the CUDA math.
// Plain C++: no LibTorch or Eigen here.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpkit/optimized/constants.hpp"
#include "kernels/host_device.hpp"
#include "kernels/vector_span.hpp"

namespace cpkit::kernels {

// CP / N: the scale that makes the average of the CP ranks' losses (FSDP's gradient average)
// the global mean over N targets; 0 when the mesh has no target, never NaN.
CPKIT_HOST_DEVICE inline float loss_scale(int cp, std::int64_t count) {
  return count > 0 ? static_cast<float>(cp) / static_cast<float>(count) : 0.0f;
}

// Running max and sum of exp(x - max): one read of the row gives log-sum-exp.
struct OnlineSoftmax {
  float max;
  float sum;
};

CPKIT_HOST_DEVICE inline OnlineSoftmax online_empty() { return {-INFINITY, 0.0f}; }

CPKIT_HOST_DEVICE inline float bits_to_float(std::int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// exp(x) within ~2 ulp for x in [-87, 88] (Cephes' expf): a branch-free polynomial that
// compilers vectorise on the CPU. On the GPU one MUFU.EX2 (__expf: 2 ulp near 0, more only
// where exp(x) is already negligible against the row's sum) instead: a row streamed from HBM
// leaves a few instructions per logit. Below -87 (where expf leaves the normal floats) both
// return exactly 0, so a masked logit (-inf) weighs nothing.
CPKIT_HOST_DEVICE inline float fast_exp(float x) {
  const bool underflow = x < -87.0f;
#if defined(__CUDA_ARCH__)
  return underflow ? 0.0f : __expf(x > 88.0f ? 88.0f : x);
#else
  x = underflow ? -87.0f : (x > 88.0f ? 88.0f : x);  // selects, not calls: vectorisable
  const float n = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return underflow ? 0.0f : p * bits_to_float((static_cast<std::int32_t>(n) + 127) << 23);
#endif
}

// tanh through fast_exp: 1 - 2 / (exp(2x) + 1), exact at the saturated ends. On the GPU the
// division is the fast one (__fdividef gives 0 for a denominator past 2^126: tanh = 1, the
// saturated value).
CPKIT_HOST_DEVICE inline float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return 1.0f - __fdividef(2.0f, fast_exp(2.0f * x) + 1.0f);
#else
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
#endif
}

// z / c as z * (1 / c): the reciprocal is loop-invariant, so it is computed once per row
// loop instead of a division per logit.
CPKIT_HOST_DEVICE inline float over_cap(float z, float softcap) { return z * (1.0f / softcap); }

// The model's soft cap c * tanh(z / c). kCapped = false: the identity (softcap <= 0).
template <bool kCapped>
CPKIT_HOST_DEVICE inline float capped(float z, float softcap) {
  if constexpr (kCapped)
    return softcap * fast_tanh(over_cap(z, softcap));
  else
    return z;
}

CPKIT_HOST_DEVICE inline float capped(float z, float softcap) {
  return softcap > 0.0f ? capped<true>(z, softcap) : z;
}

CPKIT_HOST_DEVICE inline void online_add(OnlineSoftmax& s, float x) {
  if (x > s.max) {
    s.sum = s.sum * fast_exp(s.max - x) + 1.0f;
    s.max = x;
  } else if (x != -INFINITY) {  // a masked logit adds 0; exp(-inf - -inf) would be NaN
    s.sum += fast_exp(x - s.max);
  }
}

// Four logits at once (a float4 of the row): one rescale when their max raises the running
// max, then four exps without a branch each. A masked logit (-inf) adds exp(-inf) = 0; four
// of them leave the state as it was.
CPKIT_HOST_DEVICE inline void online_add4(OnlineSoftmax& s, float a, float b, float c, float d) {
  const float ab = a > b ? a : b, cd = c > d ? c : d;
  const float m = ab > cd ? ab : cd;
  if (m > s.max) {
    s.sum *= fast_exp(s.max - m);
    s.max = m;
  }
  if (s.max != -INFINITY)
    s.sum +=
        (fast_exp(a - s.max) + fast_exp(b - s.max)) + (fast_exp(c - s.max) + fast_exp(d - s.max));
}

// The shift a block of logits is exponentiated against: its max, or 0 for a block of masked
// logits only (max -inf), so that exp(-inf - shift) is 0 and never exp(NaN).
CPKIT_HOST_DEVICE inline float finite_shift(float block_max) {
  return block_max == -INFINITY ? 0.0f : block_max;
}

CPKIT_HOST_DEVICE inline OnlineSoftmax online_merge(OnlineSoftmax a, OnlineSoftmax b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * fast_exp(a.max - m) + b.sum * fast_exp(b.max - m)};
}

// log(sum exp(c - max)). Kept apart from max: adding them first (log-sum-exp) would round
// away ln V against |z| ~ 1e4 in float32.
CPKIT_HOST_DEVICE inline float log_sum(OnlineSoftmax s) { return logf(s.sum); }

// CE of the target's capped logit: (max - c_target) + log_sum, max subtracted first.
CPKIT_HOST_DEVICE inline float cross_entropy_value(float capped_target, OnlineSoftmax s) {
  return (s.max - capped_target) + log_sum(s);
}

// d(scale * CE) / d z from the logit's softmax probability p (and, with the cap, its
// t = tanh(z / c), whose 1 - t^2 is the cap's chain rule).
template <bool kCapped>
CPKIT_HOST_DEVICE inline float grad_from_probability(float p, bool is_target, float t,
                                                     float scale) {
  const float onehot = is_target ? 1.0f : 0.0f;
  if constexpr (kCapped)
    return (p - onehot) * scale * (1.0f - t * t);
  else
    return (p - onehot) * scale;
}

// d(scale * CE) / d z for one logit z of a row whose capped maximum is `row_max` and whose
// log_sum is `ls` (softmax = exp((c - row_max) - ls)); with the cap, one tanh gives both the
// capped value and its derivative.
template <bool kCapped>
CPKIT_HOST_DEVICE inline float cross_entropy_grad(float z, bool is_target, float row_max, float ls,
                                                  float softcap, float scale) {
  if constexpr (kCapped) {
    const float t = fast_tanh(over_cap(z, softcap));
    return grad_from_probability<true>(fast_exp((softcap * t - row_max) - ls), is_target, t, scale);
  } else {
    return grad_from_probability<false>(fast_exp((z - row_max) - ls), is_target, 0.0f, scale);
  }
}

CPKIT_HOST_DEVICE inline float cross_entropy_grad(float z, bool is_target, float row_max, float ls,
                                                  float softcap, float scale) {
  return softcap > 0.0f ? cross_entropy_grad<true>(z, is_target, row_max, ls, softcap, scale)
                        : cross_entropy_grad<false>(z, is_target, row_max, ls, softcap, scale);
}

}  // namespace cpkit::kernels
