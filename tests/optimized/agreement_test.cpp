// Ranks that disagree (docs/spec.md section 3): each case raises cpkit::Error on every rank,
// naming the argument, both ranks and both values, within a second; the group still works
// afterwards. Real Gloo rank processes, CP 2 and 3 (the odd rank out is the last).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/policy_loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "cpkit/optimized/validation.hpp"
#include "rank_expectations.hpp"

namespace cpkit {
namespace {

using Clock = std::chrono::steady_clock;
using testing::expect_all_ranks_ok;
using testing::require;
using testing::run_ranks;

// Runs `body(differs)` on every rank, `differs` true on the last; every rank must raise an
// Error naming `argument` whose text holds each of `expected`, within a second, and a gather
// right after must work (the group is not broken).
void expect_disagreement(int world, const std::function<void(bool differs, const MeshPtr&)>& body,
                         const std::string& argument, const std::vector<std::string>& expected) {
  expect_all_ranks_ok(run_ranks(world, [&](int rank, const MeshPtr& mesh) {
    const auto began = Clock::now();
    try {
      body(rank == world - 1, mesh);
    } catch (const Error& e) {
      const std::string what = e.what();
      require(Clock::now() - began < std::chrono::seconds(1), "raised within a second: " + what);
      require(e.argument() == argument, "names '" + argument + "': " + what);
      for (const std::string& part : expected)
        require(what.find(part) != std::string::npos, "says '" + part + "': " + what);
      require(what.find("rank " + std::to_string(rank)) != std::string::npos,
              "names this rank: " + what);
      const at::Tensor after = gather_tokens(at::full({2}, rank, at::kLong), mesh, false);
      require(after[2 * (world - 1)].item<int64_t>() == world - 1, "the next collective works");
      return;
    }
    throw std::runtime_error("no error although the ranks disagree");
  }));
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, GatherDtypesThatDifferRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) {
        gather_tokens(at::zeros({3, 2}, differs ? at::kDouble : at::kFloat), mesh, true);
      },
      "value", {"the dtype", "Double", "Float"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, GatherSupportedDtypesThatDifferRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) {
        gather_tokens(at::zeros({3, 2}, differs ? at::kBFloat16 : at::kFloat), mesh, false);
      },
      "value", {"the dtype", "BFloat16", "Float"});
}

// A loss call on [B, L, V] logits.
void loss_of(int64_t B, int64_t L, int64_t V, const MeshPtr& mesh) {
  const at::Tensor labels = at::randint(0, V, {B, L}, at::kLong);
  shifted_cp_loss(at::randn({B, L, V}), labels, at::ones({B * L}, at::kBool), mesh);
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossLocalLengthsThatDifferRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) { loss_of(2, differs ? 9 : 8, 32, mesh); }, "logits",
      {"the local length L is ", " 8 ", " 9 "});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossVocabulariesThatDifferRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) { loss_of(2, 8, differs ? 33 : 32, mesh); }, "logits",
      {"the vocabulary size V", "32", "33"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossBatchSizesThatDifferRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) { loss_of(differs ? 3 : 2, 8, 32, mesh); }, "logits",
      {"the batch size B"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LinearLossVocabulariesThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        const int64_t V = differs ? 33 : 32;
                        shifted_cp_linear_loss(at::randn({1, 4, 8}), at::randn({V, 8}),
                                               at::randint(0, 32, {1, 4}, at::kLong),
                                               at::ones({4}, at::kBool), mesh);
                      },
                      "weight", {"the vocabulary size V", "32", "33"});
}

// Heads of another dtype on one rank: the losses' agreed fields include the dtype (a rank
// computing in bf16 while its peers use fp32 would silently change the scaled sum).
at::ScalarType dtype_of(bool differs) { return differs ? at::kBFloat16 : at::kFloat; }

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossDtypesThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        shifted_cp_loss(at::randn({1, 4, 32}).to(dtype_of(differs)),
                                        at::randint(0, 32, {1, 4}, at::kLong),
                                        at::ones({4}, at::kBool), mesh);
                      },
                      "logits", {"the dtype", "BFloat16", "Float"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, LinearLossDtypesThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        shifted_cp_linear_loss(at::randn({1, 4, 8}).to(dtype_of(differs)),
                                               at::randn({32, 8}).to(dtype_of(differs)),
                                               at::randint(0, 32, {1, 4}, at::kLong),
                                               at::ones({4}, at::kBool), mesh);
                      },
                      "hidden", {"the dtype", "BFloat16", "Float"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, PolicyLossKindsThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        const at::Tensor x = at::zeros({1, 4});
                        PolicyLossOptions o;
                        o.kind = differs ? PolicyKind::kCispo : PolicyKind::kPpo;
                        policy_loss(at::randn({1, 4, 8}), at::randn({32, 8}),
                                    at::randint(0, 32, {1, 4}, at::kLong), at::ones({4}, at::kBool),
                                    mesh, {x, x, {}, {}, {}}, o);
                      },
                      "kind", {"the kind", "1", "0"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, TokenLogprobsDtypesThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        token_logprobs(at::randn({1, 4, 8}).to(dtype_of(differs)),
                                       at::randn({32, 8}).to(dtype_of(differs)),
                                       at::randint(0, 32, {1, 4}, at::kLong),
                                       at::ones({4}, at::kBool), mesh);
                      },
                      "hidden", {"the dtype", "BFloat16", "Float"});
}

// One rank passes a plan and the other none (labels made by hand, so no tie to a shard): the
// plan is among the losses' agreed fields, so both raise instead of one entering the halo
// exchange and the other the all-gather (a hang until the group's timeout).
CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossPlansThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        const auto plan = std::make_shared<const LayoutPlan>(
                            plan_layout(LayoutKind::kHeadTail, 8 * mesh->size(), mesh->size()));
                        shifted_cp_loss(
                            at::randn({1, 8, 16}), at::randint(0, 16, {1, 8}, at::kLong),
                            at::ones({8}, at::kBool), mesh, {.layout = differs ? plan : nullptr});
                      },
                      "layout", {"the layout plan", "contiguous (no plan)", "fingerprint 0x"});
}

// gather_tokens along a dim that differs per rank ([4, 4] on every rank: the shapes agree).
CPKIT_TEST_AT_CP_SIZES(AgreementTest, GatherDimsThatDifferRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        gather_tokens(at::zeros({4, 4}), mesh, false, differs ? 1 : 0);
                      },
                      "dim", {"the gather dim", "0", "1"});
}

// With value checks off, a rank whose shape changes after a shape every rank has seen: the
// agreement exchange still runs on every rank (none skips it on its own history), so all
// raise instead of one aborting in a collective of another size; the next call works.
void with_checks_off_after_a_seen_shape(int world,
                                        const std::function<void(int64_t, const MeshPtr&)>& call,
                                        const std::string& argument) {
  expect_disagreement(world,
                      [&](bool differs, const MeshPtr& mesh) {
                        set_value_checks(ValueChecks::kNever);
                        call(6, mesh);  // seen by every rank
                        call(differs ? 7 : 6, mesh);
                      },
                      argument, {"rank"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ChecksOffGatherShapeChangeRaises, 2, 3) {
  with_checks_off_after_a_seen_shape(
      cp_size_param,
      [](int64_t n, const MeshPtr& mesh) {
        gather_tokens(at::zeros({n, 3}), mesh, false);
      },
      "value");
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ChecksOffLossShapeChangeRaises, 2, 3) {
  with_checks_off_after_a_seen_shape(
      cp_size_param, [](int64_t n, const MeshPtr& mesh) { loss_of(1, n, 16, mesh); }, "logits");
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ChecksOffLinearLossShapeChangeRaises, 2, 3) {
  with_checks_off_after_a_seen_shape(
      cp_size_param,
      [](int64_t n, const MeshPtr& mesh) {
        shifted_cp_linear_loss(at::randn({1, n, 8}), at::randn({16, 8}),
                               at::randint(0, 16, {1, n}, at::kLong), at::ones({n}, at::kBool),
                               mesh);
      },
      "hidden");
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ChecksOffTokenLogprobsShapeChangeRaises, 2, 3) {
  with_checks_off_after_a_seen_shape(
      cp_size_param,
      [](int64_t n, const MeshPtr& mesh) {
        token_logprobs(at::randn({1, n, 8}), at::randn({16, 8}),
                       at::randint(0, 16, {1, n}, at::kLong), at::ones({n}, at::kBool), mesh);
      },
      "hidden");
}

CPBatch ids_batch(int64_t S, uint64_t seed) {
  at::manual_seed(seed);
  CPBatch b;
  b.input_ids = at::randint(1, 50, {2, S}, at::kLong);
  b.labels = b.input_ids.clone();
  return b;
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ShardingDifferentBatchesRaise, 2, 3) {
  // A data loader seeded per rank: same shapes, other tokens.
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        prepare_cp_inputs(ids_batch(12, differs ? 2 : 1), mesh);
                      },
                      "input_ids", {"holds different values", "same global batch"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ShardingOneChangedLabelRaises, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        CPBatch b = ids_batch(12, 1);
                        if (differs) b.labels[1][7] = -100;
                        prepare_cp_inputs(b, mesh);
                      },
                      "labels", {"holds different values"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ShardingDifferentLengthsRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        prepare_cp_inputs(ids_batch(differs ? 13 : 12, 1), mesh);
                      },
                      "labels", {"the sequence length S", "12", "13"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ShardingDifferentDocumentLengthsRaise, 2, 3) {
  expect_disagreement(
      cp_size_param,
      [](bool differs, const MeshPtr& mesh) {
        CPBatch b = ids_batch(12, 1);
        b.input_ids = b.input_ids.narrow(0, 0, 1);
        b.labels = b.labels.narrow(0, 0, 1);
        b.qkv_format = "thd";
        b.seq_lens =
            at::tensor(std::vector<int64_t>{differs ? 5 : 6, differs ? 7 : 6}).unsqueeze(0);
        b.seq_lens_padded = b.seq_lens.clone();
        prepare_packed_cp_inputs(b, mesh, 1);
      },
      "seq_lens", {"holds different values"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ShardingDifferentOptionsRaise, 2, 3) {
  expect_disagreement(cp_size_param,
                      [](bool differs, const MeshPtr& mesh) {
                        prepare_cp_inputs(ids_batch(12, 1), mesh, 1, true,
                                          {.pad_multiple = differs ? 2 : 1});
                      },
                      "pad_multiple", {"pad_multiple is ", "1", "2"});
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, ChecksOffShardingShapeChangeRaises, 2, 3) {
  with_checks_off_after_a_seen_shape(
      cp_size_param,
      [](int64_t n, const MeshPtr& mesh) { prepare_cp_inputs(ids_batch(2 * n, 1), mesh); },
      "labels");
}

// A loss given no plan for a shard cut with the balanced layout (every rank alike) would read
// each fragment's next token from the wrong place; the shard's valid remembers its plan.
CPKIT_TEST_AT_CP_SIZES(AgreementTest, LossWithoutTheShardsPlanRaises, 2, 3) {
  expect_all_ranks_ok(run_ranks(cp_size_param, [](int, const MeshPtr& mesh) {
    CPBatch b = ids_batch(600, 1);
    b.input_ids = b.input_ids.narrow(0, 0, 1);
    b.labels = b.labels.narrow(0, 0, 1);
    b.qkv_format = "thd";
    b.seq_lens = at::tensor(std::vector<int64_t>{520, 80}).unsqueeze(0);
    b.seq_lens_padded = b.seq_lens.clone();
    const LocalShard l =
        prepare_packed_cp_inputs(b, mesh, 1, true, {.layout = LayoutKind::kBalanced}).local(0);
    const at::Tensor logits = at::randn({1, l.layout.local_len, 50});
    shifted_cp_loss(logits, l.labels, l.valid, mesh, {.layout = l.layout.plan});  // passes
    try {
      shifted_cp_loss(logits, l.labels, l.valid, mesh);
    } catch (const Error& e) {
      require(e.argument() == "layout", std::string("names 'layout': ") + e.what());
      require(std::string(e.what()).find("\"balanced\"") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("no error for a balanced shard's loss without its plan");
  }));
}

CPKIT_TEST_AT_CP_SIZES(AgreementTest, AgreeingRanksPass, 2, 3) {
  const int world = cp_size_param;
  expect_all_ranks_ok(run_ranks(world, [](int, const MeshPtr& mesh) {
    const Sharder s = prepare_cp_inputs(ids_batch(12, 1), mesh);
    require(s.local(0).input_ids.size(1) * mesh->size() >= 12, "sharded");
    loss_of(2, 8, 32, mesh);
  }));
}

TEST(ValueChecksum, ChangesWithAnyOneValueAndWithASwap) {
  const at::Tensor t = at::randint(-1000, 1000, {3, 17}, at::kLong);
  const int64_t base = detail::value_checksum(t).item<int64_t>();
  EXPECT_EQ(detail::value_checksum(t.clone()).item<int64_t>(), base);
  for (int64_t i = 0; i < t.numel(); ++i) {
    at::Tensor changed = t.clone();
    changed.view({-1})[i] += 1;
    EXPECT_NE(detail::value_checksum(changed).item<int64_t>(), base) << "index " << i;
  }
  at::Tensor swapped = t.clone();
  swapped[0][0] = t[2][16];
  swapped[2][16] = t[0][0];
  if (t[0][0].item<int64_t>() != t[2][16].item<int64_t>()) {
    EXPECT_NE(detail::value_checksum(swapped).item<int64_t>(), base);
  }
  // The tensor-op form (CUDA) is the same sum.
  EXPECT_EQ(detail::value_checksum_ops(t).item<int64_t>(), base);
  const at::Tensor big = at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {100000}, at::kLong);
  EXPECT_EQ(detail::value_checksum_ops(big).item<int64_t>(),
            detail::value_checksum(big).item<int64_t>());
  // Bool masks and int64 masks of the same values agree.
  const at::Tensor mask = t > 0;
  EXPECT_EQ(detail::value_checksum(mask).item<int64_t>(),
            detail::value_checksum(mask.to(at::kLong)).item<int64_t>());
}

}  // namespace
}  // namespace cpkit
