// The closeness rule on LibTorch tensors, as every optimized-side comparator applies it.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "tensor_closeness.hpp"

namespace cpkit::harness {
namespace {

TEST(TensorCloseness, NanAndInfMismatchesFail) {
  const at::Tensor expected = at::tensor({1.0f, 2.0f, 3.0f});
  EXPECT_EQ(tensor_mismatch(expected.clone(), expected, 0, 0), "");
  EXPECT_NE(tensor_mismatch(at::tensor({1.0f, NAN, 3.0f}), expected, 1e9, 1e9), "");
  EXPECT_NE(tensor_mismatch(at::tensor({1.0f, INFINITY, 3.0f}), expected, 1e9, 1e9), "");
  EXPECT_NE(tensor_mismatch(at::tensor({-INFINITY}), at::tensor({INFINITY}), 1e9, 1e9), "");
  EXPECT_EQ(tensor_mismatch(at::tensor({-INFINITY}), at::tensor({-INFINITY}), 0, 0), "");
  EXPECT_EQ(tensor_mismatch(at::tensor({-0.0f}), at::tensor({0.0f}), 0, 0), "");
}

TEST(TensorCloseness, ShapeMismatchFailsEvenWithEqualValues) {
  EXPECT_NE(tensor_mismatch(at::zeros({2, 3}), at::zeros({3, 2}), 1, 1), "");
  EXPECT_NE(tensor_mismatch(at::zeros({6}), at::zeros({2, 3}), 1, 1), "");
}

TEST(TensorCloseness, NonContiguousAndOtherDtypesCompareByValue) {
  const at::Tensor base = at::arange(6, at::kFloat).view({2, 3});
  EXPECT_EQ(tensor_mismatch(base.t(), base.t().contiguous(), 0, 0), "");
  EXPECT_EQ(tensor_mismatch(base.to(at::kDouble), base, 0, 0), "");
  const std::string diff = tensor_mismatch(base + 0.25, base, 0.2, 0);
  EXPECT_NE(diff.find("element 0"), std::string::npos) << diff;
}

TEST(TensorCloseness, ToleranceEdges) {
  EXPECT_EQ(tensor_mismatch(at::tensor({1.5}, at::kDouble), at::tensor({1.0}, at::kDouble), 0.5, 0),
            "");
  EXPECT_NE(tensor_mismatch(at::tensor({1.5 + 1e-12}, at::kDouble), at::tensor({1.0}, at::kDouble),
                            0.5, 0),
            "");
}

}  // namespace
}  // namespace cpkit::harness
