// SPEC 6 items 4, 5, 6 and 7 on the optimized path in real rank processes: gather backward,
// CP attention through gather_tokens, and shifted_cp_loss, each against the reference.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <sstream>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "tasks.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

using reference::harness::gen_bshd_case;
using reference::harness::gen_packed_case;
using reference::harness::make_batch;
using reference::harness::options_of;
using reference::harness::random_floats;

// ---- gather_tokens ----

void check_gather(int cp, int tokens, int features, std::uint64_t seed) {
  std::ostringstream payload;
  payload << tokens << " " << features << " " << seed;
  const auto bundles =
      bundles_of(pool::RankPool::instance().run(cp, kGather, payload.str()), kGather);
  std::vector<reference::FloatMatrix> values, upstream;
  for (int r = 0; r < cp; ++r) {
    values.push_back(random_floats(tokens, features, 1, seed + r));
    upstream.push_back(random_floats(cp * tokens, features, 1, seed + 100 + r) *
                       static_cast<float>(r + 1));
  }
  const at::Tensor gathered = to_tensor(reference::gather_tokens(values));
  const auto grads = reference::gather_tokens_backward(upstream);
  for (int r = 0; r < cp; ++r) {
    require_same(bundles[r].get("gathered"), gathered, "gathered on rank " + std::to_string(r));
    // Float sums in a different order: a few ulp of the largest term.
    require_near(bundles[r].get("grad"), to_tensor(grads[r]), kGatherGradAtol * cp, kGatherGradRtol,
                 "owner gradient on rank " + std::to_string(r));
  }
}

// Failure class: gather backward that averages or narrows instead of summing.
RC_GTEST_PROP(OptimizedGather, BackwardSumsRankWeightedSlices, ()) {
  check_gather(*rc::gen::inRange(1, 9), *rc::gen::inRange(0, 6), *rc::gen::inRange(1, 5),
               *rc::gen::arbitrary<std::uint32_t>());
}

RC_GTEST_PROP(OptimizedGather, MismatchedCountsRaiseOnEveryRank, ()) {
  const int cp = *rc::gen::inRange(2, 9);
  const auto replies = pool::RankPool::instance().run(cp, kGatherMismatch, "");
  for (int r = 0; r < cp; ++r) {
    RC_ASSERT(!replies[r].ok);
    RC_ASSERT(replies[r].bytes.find("argument 'value'") != std::string::npos);
  }
}

// ---- attention ----

RC_GTEST_PROP(OptimizedAttention, CpAttentionEqualsReference, ()) {
  PackedCase c = *gen_packed_case();
  c.rows.resize(1);
  const int head = *rc::gen::inRange(1, 5);
  const auto bundles = bundles_of(
      pool::RankPool::instance().run(c.cp, kAttention, std::to_string(head) + " " + encode(c)),
      kAttention);
  const reference::Sharder s = reference::prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const auto T = s.global(0).padded_len;
  std::vector<reference::RankAttention> ranks;
  std::vector<reference::FloatMatrix> d_out;
  for (int r = 0; r < c.cp; ++r) {
    const reference::LocalShard l = s.local(0, r);
    const auto b = l.layout.begin, n = l.layout.local_len;
    auto cut = [&](std::uint64_t k) {
      return reference::FloatMatrix(random_floats(T, head, 1, c.seed + k).middleRows(b, n));
    };
    ranks.push_back({cut(1),
                     cut(2),
                     cut(3),
                     {l.position_ids.row(0).transpose(), l.document_ids.row(0).transpose(),
                      l.padding.row(0).transpose()}});
    d_out.push_back(cut(4));
  }
  const auto out = reference::cp_attention(ranks);
  const auto grads = reference::cp_attention_backward(ranks, d_out);
  for (int r = 0; r < c.cp; ++r) {
    const std::string on = " on rank " + std::to_string(r);
    require_near(bundles[r].get("out"), to_tensor(out[r]), kAttentionAtol, kAttentionRtol,
                 "output" + on);
    require_near(bundles[r].get("dq"), to_tensor(grads[r].dq), kAttentionAtol, kAttentionRtol,
                 "dQ" + on);
    require_near(bundles[r].get("dk"), to_tensor(grads[r].dk), kAttentionAtol * c.cp,
                 kAttentionRtol, "dK" + on);
    require_near(bundles[r].get("dv"), to_tensor(grads[r].dv), kAttentionAtol * c.cp,
                 kAttentionRtol, "dV" + on);
  }
}

// ---- shifted_cp_loss ----

template <class Case>
void check_loss(const Case& c, const reference::Sharder& s, const std::string& task,
                double softcap) {
  std::ostringstream payload;
  payload << softcap << " " << encode(c);
  const auto bundles = bundles_of(pool::RankPool::instance().run(c.cp, task, payload.str()), task);
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const reference::GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    const reference::FloatMatrix global =
        random_floats(rows * g.padded_len, c.vocab, c.logit_scale, c.seed + 7 + m);
    std::vector<reference::FloatMatrix> logits;
    std::vector<reference::IntMatrix> labels;
    std::vector<reference::BoolVector> valid;
    for (int r = 0; r < c.cp; ++r) {
      const reference::LocalShard l = s.local(m, r);
      reference::FloatMatrix mine(rows * l.layout.local_len, c.vocab);
      for (Eigen::Index b = 0; b < rows; ++b)
        mine.middleRows(b * l.layout.local_len, l.layout.local_len) =
            global.middleRows(b * g.padded_len + l.layout.begin, l.layout.local_len);
      logits.push_back(mine);
      labels.push_back(l.labels);
      valid.push_back(l.valid);
    }
    const auto ref = reference::shifted_cp_loss(logits, labels, valid, {softcap});
    const double zmax = static_cast<double>(c.logit_scale) * 6;  // |z| bound of the generator
    for (int r = 0; r < c.cp; ++r) {
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      const pool::Bundle& b = bundles[r];
      const at::Tensor value = b.get(std::to_string(m) + ".loss");
      RC_ASSERT(std::isfinite(value.item<double>()));
      const double scale = ref[r].global_targets > 0 ? double(c.cp) / ref[r].global_targets : 0;
      require_near(value.reshape({1}), at::full({1}, ref[r].value, at::kDouble),
                   loss_value_atol(zmax, c.vocab, ref[r].local_targets, scale), kLossRtol,
                   "loss" + where);
      require_near(b.get(std::to_string(m) + ".grad").reshape({-1, c.vocab}),
                   to_tensor(ref[r].grad_logits), loss_grad_atol(zmax, scale), kLossRtol,
                   "logits gradient" + where);
    }
  }
}

rc::Gen<double> gen_softcap() { return rc::gen::element(0.0, 0.0, 30.0); }

void check_bshd_loss(const BshdCase& c, double softcap) {
  check_loss(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), kLossBshd, softcap);
}

void check_packed_loss(const PackedCase& c, double softcap) {
  check_loss(c, reference::prepare_packed_cp_inputs(make_batch(c), options_of(c)), kLossPacked,
             softcap);
}

RC_GTEST_PROP(OptimizedLoss, BshdEqualsReference, ()) {
  check_bshd_loss(*gen_bshd_case(), *gen_softcap());
}

RC_GTEST_PROP(OptimizedLoss, PackedEqualsReference, ()) {
  check_packed_loss(*gen_packed_case(), *gen_softcap());
}

// Failure class: the boundary label dropped when labels are shifted per shard.
RC_GTEST_PROP(OptimizedLoss, BoundaryLabelCrossesShards, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.seq_len = *rc::gen::inRange(2 * c.cp, 6 * c.cp);
  c.ignore_percent = 0;
  c.use_mask = false;
  check_bshd_loss(c, 0.0);
}

// Failure class: the target count reduced over the wrong group (too few or too many).
RC_GTEST_PROP(OptimizedLoss, TargetsCountedOverTheWholeMesh, ()) {
  PackedCase c = *gen_packed_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.ignore_percent = 0;
  c.rows[0].push_back({*rc::gen::inRange(2 * c.cp, 40), 0});  // targets on several ranks
  check_packed_loss(c, 0.0);
}

// Failure class: NaN when a rank (or the whole mesh) has no target.
RC_GTEST_PROP(OptimizedLoss, FiniteWhenARankHasNoTarget, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.ignore_percent = *rc::gen::element(50, 100);
  c.seq_len = *rc::gen::inRange(1, c.cp + 1);  // S <= CP: some ranks hold only padding
  check_bshd_loss(c, *gen_softcap());
}

}  // namespace
}  // namespace cpkit::harness
