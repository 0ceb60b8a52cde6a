// The one closeness rule of the whole test tree (Eigen, LibTorch and plain values alike):
// |actual - expected| <= atol + rtol * |expected|. NaN on either side is never close; an
// infinity is close only to the same infinity; -0.0 equals 0.0. Plain C++, no dependencies.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>

namespace cpkit::harness {

inline bool is_close(double actual, double expected, double atol, double rtol) {
  if (std::isnan(actual) || std::isnan(expected)) return false;
  if (std::isinf(actual) || std::isinf(expected)) return actual == expected;
  return std::abs(actual - expected) <= atol + rtol * std::abs(expected);
}

// Index of the first element that is not close, or nothing.
template <class A, class E>
std::optional<std::size_t> first_mismatch(const A* actual, const E* expected, std::size_t n,
                                          double atol, double rtol) {
  for (std::size_t i = 0; i < n; ++i)
    if (!is_close(static_cast<double>(actual[i]), static_cast<double>(expected[i]), atol, rtol))
      return i;
  return std::nullopt;
}

inline std::string describe_mismatch(std::size_t index, double actual, double expected, double atol,
                                     double rtol) {
  std::ostringstream os;
  os.precision(9);
  os << "element " << index << " is " << actual << ", expected " << expected << " (atol " << atol
     << ", rtol " << rtol << ")";
  return os.str();
}

}  // namespace cpkit::harness
