// The value-check switch: CPU tensors are checked by default; with the checks off a label
// outside the vocabulary reaches the kernels, which make its row NaN instead of reading out
// of bounds (the sanitizer tree runs this too).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "agreement.hpp"
#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
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

// The fused head's kernel bound, at its edges: labels V and -1 (the first values outside
// [0, V)), in the middle row of a chunk after the first, give NaN in their own row of the
// hidden gradient and in the loss, and nothing else turns NaN: a bound off by one, or a
// negative label read as an index, would read a neighbouring row and stay finite.
TEST_F(ValueChecksTest, OffTheFusedHeadsEdgeLabelsGiveNaNInTheirRowsOnly) {
  set_value_checks(ValueChecks::kNever);
  constexpr int64_t V = 5;
  for (const int64_t stray : {V, int64_t{-1}}) {
    const at::Tensor edge = at::tensor({0L, 1L, 2L, 3L, 4L, 0L}).unsqueeze(0);
    at::Tensor bad = edge.clone();
    bad[0][5] = stray;  // the target of position 4, mid second chunk of 3 rows
    LinearLossOptions options;
    options.chunk_rows = 3;
    const at::Tensor hidden = at::randn({1, 6, 3}), weight = at::randn({V, 3});
    const auto head = shifted_cp_linear_loss_with_grad(hidden, weight, bad,
                                                       at::ones({6}, at::kBool), nullptr, options);
    EXPECT_TRUE(std::isnan(head.loss.item<float>())) << "label " << stray;
    const at::Tensor row_nan = head.grad_hidden[0].isnan().all(1);
    EXPECT_TRUE(row_nan[4].item<bool>()) << "label " << stray;
    EXPECT_EQ(row_nan.sum().item<int64_t>(), 1) << "label " << stray;
    const auto good = shifted_cp_linear_loss_with_grad(hidden, weight, edge,
                                                       at::ones({6}, at::kBool), nullptr, options);
    EXPECT_TRUE(std::isfinite(good.loss.item<float>()));  // labels 0 and V - 1 are in range
  }
}

}  // namespace
}  // namespace cpkit

namespace cpkit {
namespace {

// A two-rank mesh in one process whose other rank always holds what this one holds; it
// counts its all-gathers (the gather's shape check is one, the data another).
class MirrorMesh final : public Communicator {
 public:
  explicit MirrorMesh(std::string group = "") : group_(std::move(group)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "mirror"; }
  std::string group_name() const override { return group_; }
  void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    ++all_gathers;
    const std::size_t bytes = count * scalar_bytes(kind);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  void reduce_scatter_sum(const void*, void*, std::size_t, ScalarKind) override {}
  void all_reduce_sum(void*, std::size_t, ScalarKind) override {}
  void shift_from_next(const void*, void*, std::size_t, ScalarKind) override {}
  int all_gathers = 0;

 private:
  std::string group_;
};

// The agreement exchange runs on every call, whatever the value checks say and whatever
// this rank has seen: a rank that skipped it on its own history while a peer whose shape
// changed entered it would leave the two in collectives of different sizes.
TEST_F(ValueChecksTest, GatherExchangesItsAgreementOnEveryCall) {
  auto mesh = std::make_shared<MirrorMesh>();
  const MeshPtr as_mesh = mesh;
  auto gathers_of = [&](const at::Tensor& value) {
    const int before = mesh->all_gathers;
    const at::Tensor out = gather_tokens(value, as_mesh, false);
    EXPECT_TRUE(at::equal(out.narrow(0, 0, value.size(0)), value));
    return mesh->all_gathers - before;
  };
  const at::Tensor a = at::randn({3, 2}), b = at::randn({5, 2});
  for (const ValueChecks checks : {ValueChecks::kCpuOnly, ValueChecks::kNever}) {
    set_value_checks(checks);
    EXPECT_EQ(gathers_of(a), 2);
    EXPECT_EQ(gathers_of(a), 2);  // seen: exchanged all the same
    EXPECT_EQ(gathers_of(b), 2);
    EXPECT_EQ(gathers_of(a.to(at::kBFloat16)), 2);
  }
}

// When the table is read on the host: always for CPU tensors and under the value checks;
// for device tensors (meta stands in for CUDA here) with checks off, once per key per mesh,
// per named group across rebuilt meshes (the Python ops build one per call).
TEST_F(ValueChecksTest, AgreementReadOncePerKeyAndGroupForDeviceTensorsWithChecksOff) {
  const at::Tensor cpu = at::zeros({2}), device = at::empty({2}, at::device(at::kMeta));
  const MeshPtr g = std::make_shared<MirrorMesh>("g"), h = std::make_shared<MirrorMesh>("h");
  const MeshPtr g_again = std::make_shared<MirrorMesh>("g");
  set_value_checks(ValueChecks::kNever);
  EXPECT_TRUE(detail::agreement_needs_reading(cpu, g, {1}));
  EXPECT_TRUE(detail::agreement_needs_reading(cpu, g, {1}));
  EXPECT_TRUE(detail::agreement_needs_reading(device, g, {2}));
  EXPECT_FALSE(detail::agreement_needs_reading(device, g, {2}));
  EXPECT_FALSE(detail::agreement_needs_reading(device, g_again, {2}));
  EXPECT_TRUE(detail::agreement_needs_reading(device, h, {2}));
  EXPECT_TRUE(detail::agreement_needs_reading(device, g, {3}));
  set_value_checks(ValueChecks::kAlways);
  EXPECT_TRUE(detail::agreement_needs_reading(device, g, {2}));
}

}  // namespace
}  // namespace cpkit
