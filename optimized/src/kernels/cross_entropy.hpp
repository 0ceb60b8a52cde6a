// The arithmetic of the fused shifted cross-entropy, written once for the CPU kernel and the
// CUDA kernel (compiled as __host__ __device__ by nvcc), so CPU tests exercise the CUDA math.
// Plain C++: no LibTorch or Eigen here.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define CPKIT_HOST_DEVICE __host__ __device__
#else
#define CPKIT_HOST_DEVICE
#endif

namespace cpkit::kernels {

inline constexpr std::int64_t kNoTarget = -100;

// Running max and sum of exp(x - max): one read of the row gives log-sum-exp.
struct OnlineSoftmax {
  float max;
  float sum;
};

CPKIT_HOST_DEVICE inline OnlineSoftmax online_empty() { return {-INFINITY, 0.0f}; }

// The model's soft cap c * tanh(z / c), or z when softcap <= 0.
CPKIT_HOST_DEVICE inline float capped(float z, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(z / softcap) : z;
}

// d capped / d z.
CPKIT_HOST_DEVICE inline float capped_derivative(float z, float softcap) {
  if (softcap <= 0.0f) return 1.0f;
  const float t = tanhf(z / softcap);
  return 1.0f - t * t;
}

CPKIT_HOST_DEVICE inline void online_add(OnlineSoftmax& s, float x) {
  if (x > s.max) {
    s.sum = s.sum * expf(s.max - x) + 1.0f;
    s.max = x;
  } else {
    s.sum += expf(x - s.max);
  }
}

CPKIT_HOST_DEVICE inline OnlineSoftmax online_merge(OnlineSoftmax a, OnlineSoftmax b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

CPKIT_HOST_DEVICE inline float log_sum_exp(OnlineSoftmax s) { return s.max + logf(s.sum); }

// d(scale * CE) / d z for one logit z of a row with log-sum-exp `lse` (of the capped row).
CPKIT_HOST_DEVICE inline float cross_entropy_grad(float z, bool is_target, float lse, float softcap,
                                                  float scale) {
  const float p = expf(capped(z, softcap) - lse);
  return (p - (is_target ? 1.0f : 0.0f)) * scale * capped_derivative(z, softcap);
}

}  // namespace cpkit::kernels
