// The value-check switch: CPU tensors are checked by default; with the checks off a label
// outside the vocabulary reaches the kernels, which make its row NaN instead of reading out
// of bounds (the sanitizer tree runs this too).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/validation.hpp"

namespace cpkit {
namespace {

class ValueChecksTest : public ::testing::Test {
 protected:
  void TearDown() override { set_value_checks(ValueChecks::kCpuOnly); }
  const at::Tensor logits = at::randn({1, 4, 5});
  const at::Tensor labels = at::tensor({0L, 1L, 9L, 2L}).unsqueeze(0);  // 9 is outside [0, 5)
  const at::Tensor valid = at::ones({4}, at::kBool);
};

TEST_F(ValueChecksTest, CpuTensorsAreCheckedByDefault) {
  EXPECT_EQ(value_checks(), ValueChecks::kCpuOnly);
  EXPECT_THROW(shifted_cp_loss(logits, labels, valid, nullptr), Error);
  set_value_checks(ValueChecks::kAlways);
  EXPECT_THROW(shifted_cp_loss(logits, labels, valid, nullptr), Error);
}

TEST_F(ValueChecksTest, OffTheStrayLabelGivesNaNNotAStrayRead) {
  set_value_checks(ValueChecks::kNever);
  const LossWithGrad out = shifted_cp_loss_with_grad(logits, labels, valid, nullptr);
  EXPECT_TRUE(std::isnan(out.loss.item<float>()));
  EXPECT_TRUE(out.grad_logits[0][1].isnan().all().item<bool>());  // position 1 predicts 9
  EXPECT_FALSE(out.grad_logits[0][0].isnan().any().item<bool>());
  const auto head = shifted_cp_linear_loss_with_grad(at::randn({1, 4, 3}), at::randn({5, 3}),
                                                     labels, valid, nullptr);
  EXPECT_TRUE(std::isnan(head.loss.item<float>()));
}

}  // namespace
}  // namespace cpkit
