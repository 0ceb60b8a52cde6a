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
    const std::size_t bytes = count * item_size(kind);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  void reduce_scatter_sum(const void*, void*, std::size_t, ScalarKind) override {}
  void all_reduce_sum(void*, std::size_t, ScalarKind) override {}
  void shift_from_next(const void*, void*, std::size_t, ScalarKind) override {}
  int all_gathers = 0;

 private:
  std::string group_;
  static std::size_t item_size(ScalarKind kind) {
    switch (kind) {
      case ScalarKind::kInt64:
        return 8;
      case ScalarKind::kFloat32:
        return 4;
      case ScalarKind::kFloat16:
      case ScalarKind::kBFloat16:
        return 2;
      case ScalarKind::kUInt8:
        return 1;
    }
    return 0;
  }
};

// Checked every call while value checks apply to the tensor; otherwise once per (mesh,
// shape, dtype): the second gather of a shape is the data collective alone.
TEST_F(ValueChecksTest, GatherShapesCheckedOncePerMeshAndShapeWhenChecksAreOff) {
  auto mesh = std::make_shared<MirrorMesh>();
  const MeshPtr as_mesh = mesh;
  auto gathers_of = [&](const at::Tensor& value) {
    const int before = mesh->all_gathers;
    const at::Tensor out = gather_tokens(value, as_mesh, false);
    EXPECT_TRUE(at::equal(out.narrow(0, 0, value.size(0)), value));
    return mesh->all_gathers - before;
  };
  const at::Tensor a = at::randn({3, 2}), b = at::randn({5, 2});
  EXPECT_EQ(gathers_of(a), 2);  // CPU tensors: checked every call by default
  EXPECT_EQ(gathers_of(a), 2);
  set_value_checks(ValueChecks::kNever);
  EXPECT_EQ(gathers_of(a), 2);  // first sighting on this mesh
  EXPECT_EQ(gathers_of(a), 1);
  EXPECT_EQ(gathers_of(b), 2);                    // a new shape
  EXPECT_EQ(gathers_of(a.to(at::kBFloat16)), 2);  // a new dtype
  EXPECT_EQ(gathers_of(b), 1);
  EXPECT_EQ(gathers_of(a), 1);
  const MeshPtr other = std::make_shared<MirrorMesh>();
  EXPECT_EQ(gather_tokens(a, other, false).size(0), 6);
  EXPECT_EQ(static_cast<MirrorMesh&>(*other).all_gathers, 2);  // a new mesh
}

// Meshes rebuilt around one named group (the Python ops build one per call) share what was
// checked: the second mesh of group "g" checks nothing already checked; another group does.
TEST_F(ValueChecksTest, GatherShapesCheckedOncePerGroupAcrossRebuiltMeshes) {
  set_value_checks(ValueChecks::kNever);
  const at::Tensor a = at::randn({4, 3});
  auto gathers_on = [&](const std::string& group) {
    auto mesh = std::make_shared<MirrorMesh>(group);
    gather_tokens(a, mesh, false);
    return mesh->all_gathers;
  };
  EXPECT_EQ(gathers_on("g"), 2);
  EXPECT_EQ(gathers_on("g"), 1);
  EXPECT_EQ(gathers_on("h"), 2);
  EXPECT_EQ(gathers_on("g"), 1);
}

}  // namespace
}  // namespace cpkit
