// The closeness rule (closeness.hpp) on LibTorch tensors, for every optimized-side test.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace cpkit::harness {

// Empty when shapes are equal and every element is close; else what differs first.
std::string tensor_mismatch(const at::Tensor& actual, const at::Tensor& expected, double atol,
                            double rtol);

}  // namespace cpkit::harness
