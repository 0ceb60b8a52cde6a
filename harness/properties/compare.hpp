// Rank-by-rank comparison helpers for the optimized-vs-reference properties.
#pragma once

#include <rapidcheck.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "bundle.hpp"
#include "rank_pool.hpp"

namespace cpkit::harness {

// Bit-exact: same shape, dtype and values.
void require_same(const at::Tensor& optimized, const at::Tensor& reference,
                  const std::string& what);
// |optimized - reference| <= atol + rtol * |reference|, everywhere.
void require_near(const at::Tensor& optimized, const at::Tensor& reference, double atol,
                  double rtol, const std::string& what);
// Every rank answered without an exception; their bundles, in rank order.
std::vector<pool::Bundle> bundles_of(const std::vector<pool::Reply>& replies,
                                     const std::string& task);

}  // namespace cpkit::harness
