// The target rules have one home (kernels/targets.hpp) and a tensor form for the ATen paths
// (targets.hpp): both must give the same answer on every combination.
#include <gtest/gtest.h>

#include "kernels/targets.hpp"
#include "targets.hpp"

namespace cpkit {
namespace {

TEST(TargetRules, TensorFormEqualsTheScalarRule) {
  for (const bool padding : {false, true})
    for (const std::int64_t label : {kIgnoreLabel, std::int64_t{0}, std::int64_t{5}})
      for (const std::int64_t offset : {0, 1, 7}) {
        const at::Tensor p = at::full({1}, padding, at::kBool);
        const at::Tensor l = at::full({1}, label, at::kLong);
        const at::Tensor o = at::full({1}, offset, at::kLong);
        const at::Tensor sharded = detail::sharded_labels(p, l);
        EXPECT_EQ(sharded.item<int64_t>(), kernels::sharded_label(padding, label));
        EXPECT_EQ(detail::valid_targets(p, sharded, o).item<bool>(),
                  kernels::is_valid_target(padding, kernels::sharded_label(padding, label), offset))
            << padding << " " << label << " " << offset;
      }
}

TEST(TargetRules, OnlyRealLabelledTokensPastTheirDocumentStartCount) {
  EXPECT_TRUE(kernels::is_valid_target(false, 3, 1));
  EXPECT_FALSE(kernels::is_valid_target(true, 3, 1));
  EXPECT_FALSE(kernels::is_valid_target(false, kIgnoreLabel, 1));
  EXPECT_FALSE(kernels::is_valid_target(false, 3, 0));
  EXPECT_EQ(kernels::sharded_label(true, 3), kIgnoreLabel);
  EXPECT_EQ(kernels::sharded_label(false, 3), 3);
}

}  // namespace
}  // namespace cpkit
