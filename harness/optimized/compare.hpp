// Rank-by-rank comparison of the optimized path against the reference inside a property.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace cpkit::harness {

// Bit-exact: same shape, dtype and values.
void require_same(const at::Tensor& optimized, const at::Tensor& reference,
                  const std::string& what);
// The closeness rule of compare/closeness.hpp (NaN is never close), else RC_FAIL.
void require_near(const at::Tensor& optimized, const at::Tensor& reference, double atol,
                  double rtol, const std::string& what);

}  // namespace cpkit::harness
