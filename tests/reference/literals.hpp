// Literal one-row matrices for hand-worked tests.
#pragma once

#include <gtest/gtest.h>

#include <string_view>

#include "cpkit/reference/types.hpp"

namespace cpkit::reference::testing {

inline IntMatrix ints(std::initializer_list<std::int64_t> values) {
  IntMatrix m(1, static_cast<Eigen::Index>(values.size()));
  Eigen::Index i = 0;
  for (auto v : values) m(0, i++) = v;
  return m;
}

// flags("0110") -> [false, true, true, false]
inline BoolMatrix flags(std::string_view bits) {
  BoolMatrix m(1, static_cast<Eigen::Index>(bits.size()));
  for (std::size_t i = 0; i < bits.size(); ++i) m(0, static_cast<Eigen::Index>(i)) = bits[i] == '1';
  return m;
}

inline BoolMatrix flags(const BoolVector& v) { return v.transpose(); }
inline IntMatrix ints(const IntVector& v) { return v.transpose(); }

// Shape-safe equality (Eigen's operator== needs equal shapes) with a readable failure.
template <class A, class B>
::testing::AssertionResult same(const A& actual, const B& expected) {
  if (actual.rows() == expected.rows() && actual.cols() == expected.cols() && actual == expected)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\nactual   [" << actual.rows() << "x" << actual.cols() << "]:\n"
         << actual << "\nexpected [" << expected.rows() << "x" << expected.cols() << "]:\n"
         << expected;
}

}  // namespace cpkit::reference::testing
