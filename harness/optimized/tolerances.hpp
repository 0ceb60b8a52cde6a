// FP32 tolerances of the optimized path against the double-precision reference, derived
// from float rounding (docs/harness.md explains each). eps = FLT_EPSILON.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace cpkit::harness {

inline constexpr double kEps = FLT_EPSILON;

// gather backward: a sum over CP float terms of magnitude <= ~40 (N(0,1) times rank weight
// <= 8): a few ulp of 40 per term, so the caller multiplies by CP.
inline constexpr double kGatherGradAtol = 8 * kEps * 40;
inline constexpr double kGatherGradRtol = 4 * kEps;

// Attention: float matmuls and softmax over <= ~60 keys of N(0,1) data vs double.
inline constexpr double kAttentionAtol = 2e-5;
inline constexpr double kAttentionRtol = 1e-4;

inline constexpr double kLossRtol = 1e-5;

// One row's float log-sum-exp errs by ~eps * (|z|max + log V) (the exponent's rounding,
// then the float sum); `rows` such rows are summed and scaled by CP / N.
inline double loss_value_atol(double zmax, std::int64_t vocab, std::int64_t rows, double scale) {
  return 8 * kEps * (zmax + std::log(static_cast<double>(vocab)) + 1) * static_cast<double>(rows) *
             scale +
         1e-12;
}

// A gradient element p - onehot errs by p * eps * |c - lse| <= eps * (2 |z|max + log V),
// scaled by CP / N.
inline double loss_grad_atol(double zmax, double scale) {
  return 8 * kEps * (2 * zmax + 16) * scale + 1e-12;
}

}  // namespace cpkit::harness
