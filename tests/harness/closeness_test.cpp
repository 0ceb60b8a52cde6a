// The closeness rule (harness/compare/closeness.hpp) and its Eigen form: NaN is never close,
// an infinity only to itself, -0.0 equals 0.0, shapes must match, and the tolerance edges.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "closeness.hpp"
#include "generators.hpp"

namespace cpkit::harness {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Closeness, NanIsNeverClose) {
  EXPECT_FALSE(is_close(kNan, 1.0, 1e9, 1e9));
  EXPECT_FALSE(is_close(1.0, kNan, 1e9, 1e9));
  EXPECT_FALSE(is_close(kNan, kNan, 1e9, 1e9));
}

TEST(Closeness, InfinityIsCloseOnlyToItself) {
  EXPECT_TRUE(is_close(kInf, kInf, 0, 0));
  EXPECT_TRUE(is_close(-kInf, -kInf, 0, 0));
  EXPECT_FALSE(is_close(kInf, -kInf, 1e9, 1e9));
  EXPECT_FALSE(is_close(kInf, 1e300, 1e9, 1e9));
  EXPECT_FALSE(is_close(1e300, kInf, 1e9, 1e9));
  EXPECT_FALSE(is_close(-kInf, 0.0, 1e9, 1e9));
}

TEST(Closeness, NegativeZeroEqualsZero) {
  EXPECT_TRUE(is_close(-0.0, 0.0, 0, 0));
  EXPECT_TRUE(is_close(0.0, -0.0, 0, 0));
}

TEST(Closeness, ToleranceEdges) {
  // |a - e| <= atol + rtol * |e|, inclusive; the relative part scales with the expected value.
  EXPECT_TRUE(is_close(1.5, 1.0, 0.5, 0));
  EXPECT_FALSE(is_close(1.5 + 1e-12, 1.0, 0.5, 0));
  EXPECT_TRUE(is_close(150.0, 100.0, 0, 0.5));
  EXPECT_FALSE(is_close(150.0 + 1e-9, 100.0, 0, 0.5));
  EXPECT_FALSE(is_close(1.0, 150.0, 0, 0.5));  // |e| sets the scale, not |a|
  EXPECT_TRUE(is_close(2.0, 2.0, 0, 0));
  EXPECT_FALSE(is_close(2.0, std::nextafter(2.0, 3.0), 0, 0));
}

TEST(Closeness, FirstMismatchFindsTheFirstBadElement) {
  const float actual[] = {1.0f, 2.0f, NAN, 4.0f};
  const double expected[] = {1.0, 2.0, 3.0, 5.0};
  EXPECT_EQ(first_mismatch(actual, expected, 4, 0.1, 0), 2u);
  EXPECT_EQ(first_mismatch(actual, expected, 2, 0, 0), std::nullopt);
}

TEST(Closeness, EigenMismatchCatchesNanInfAndShape) {
  reference::FloatMatrix a = reference::FloatMatrix::Ones(2, 3), e = a;
  EXPECT_EQ(mismatch(a, e, 0, 0), "");
  a(1, 2) = NAN;
  EXPECT_NE(mismatch(a, e, 1, 1), "");
  a(1, 2) = INFINITY;
  EXPECT_NE(mismatch(a, e, 1, 1), "");
  e(1, 2) = INFINITY;
  EXPECT_EQ(mismatch(a, e, 0, 0), "");
  EXPECT_NE(mismatch(reference::FloatMatrix::Ones(3, 2), reference::FloatMatrix::Ones(2, 3), 1, 1),
            "");
}

}  // namespace
}  // namespace cpkit::harness
