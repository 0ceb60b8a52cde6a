// Bad input to shifted_cp_linear_loss raises cpkit::Error naming the argument and the values.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "expect_rejected.hpp"

namespace cpkit {
namespace {

const auto expect_rejected = &cpkit::test::expect_rejected<Error>;

const at::Tensor kLabels = at::zeros({1, 3}, at::kLong);
const at::Tensor kValid = at::ones({3}, at::kBool);

void call(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels = kLabels,
          const at::Tensor& valid = kValid, LinearLossOptions options = {}) {
  shifted_cp_linear_loss(hidden, weight, labels, valid, nullptr, options);
}

// Zero hidden states and head: every logit is 0, so each counted target costs ln V.
TEST(BadInputLinearLoss, GoodInputIsAccepted) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor loss = shifted_cp_linear_loss(
        at::zeros({1, 3, 8}, dtype), at::zeros({5, 8}, dtype), kLabels, kValid, nullptr);
    EXPECT_NEAR(loss.item<double>(), std::log(5.0), 1e-6) << dtype;
  }
}

TEST(BadInputLinearLoss, DtypesDiffer) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8}, at::kBFloat16));
      },
      "weight", {"BFloat16", "Float"});
}

TEST(BadInputLinearLoss, DtypeNotSupported) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}, at::kDouble), at::zeros({5, 8}, at::kDouble));
      },
      "hidden", {"float32 or bfloat16", "Double"});
}

TEST(BadInputLinearLoss, DevicesDiffer) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8}, at::TensorOptions().device(at::kMeta)));
      },
      "weight", {"meta", "cpu"});
}

TEST(BadInputLinearLoss, HiddenSizeDiffers) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 7}));
      },
      "weight", {"H = 8", "[5, 7]"});
}

TEST(BadInputLinearLoss, WeightNotTwoDimensional) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8, 1}));
      },
      "weight", {"2 dimensions", "[5, 8, 1]"});
}

TEST(BadInputLinearLoss, HiddenNotThreeDimensional) {
  expect_rejected(
      [] {
        call(at::zeros({3, 8}), at::zeros({5, 8}));
      },
      "hidden", {"3 dimensions", "[3, 8]"});
}

TEST(BadInputLinearLoss, EmptyShapes) {
  expect_rejected(
      [] {
        call(at::zeros({0, 3, 8}), at::zeros({5, 8}), at::zeros({0, 3}, at::kLong),
             at::ones({0}, at::kBool));
      },
      "hidden", {"empty batch", "[0, 3, 8]"});
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 0}), at::zeros({5, 0}));
      },
      "hidden", {"no features", "[1, 3, 0]"});
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({1, 8}));
      },
      "weight", {">= 2", "got 1"});
}

TEST(BadInputLinearLoss, LabelOutsideTheHeadsVocabulary) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8}), at::tensor({0L, 5L, 1L}).unsqueeze(0));
      },
      "labels", {"value 5", "[0, 5)"});
}

TEST(BadInputLinearLoss, LabelsNotMatchingHidden) {
  expect_rejected(
      [] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8}), at::zeros({1, 4}, at::kLong));
      },
      "labels", {"[1, 4]", "hidden need [1, 3]"});
}

TEST(BadInputLinearLoss, NegativeChunk) {
  LinearLossOptions options;
  options.chunk_rows = -2;
  expect_rejected(
      [&] {
        call(at::zeros({1, 3, 8}), at::zeros({5, 8}), kLabels, kValid, options);
      },
      "chunk_rows", {"got -2"});
}

TEST(BadInputLinearLoss, SoftcapNegativeOrNotFinite) {
  for (const double cap : {-1.0, -0.0 - 1e-9, std::nan(""), double{INFINITY}}) {
    LinearLossOptions options;
    options.softcap = cap;
    expect_rejected(
        [&] {
          call(at::zeros({1, 3, 8}), at::zeros({5, 8}), kLabels, kValid, options);
        },
        "softcap", {"must be finite and >= 0"});
  }
}

}  // namespace
}  // namespace cpkit
