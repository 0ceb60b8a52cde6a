// docs/spec.md sections 5 and 7 on the optimized path in real rank processes: shifted_cp_loss and
// its gradient against the reference for BSHD and packed batches, soft cap on and off, upstream
// gradients other than 1, non-contiguous labels and valid masks, production vocabularies.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "layouts.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

// What a loss case adds to its batch: the cap, the upstream gradient of the loss, and the
// memory layout of labels and valid.
struct LossParams {
  double softcap = 0;
  double upstream = 1;
  MemoryLayout layout = MemoryLayout::kContiguous;
};

std::ostream& operator<<(std::ostream& os, const LossParams& p) {
  return os << p.softcap << "," << p.upstream << "," << static_cast<int>(p.layout);
}

std::istream& operator>>(std::istream& in, LossParams& p) {
  std::string text;
  in >> text;
  int layout = 0;
  std::sscanf(text.c_str(), "%lf,%lf,%d", &p.softcap, &p.upstream, &layout);
  p.layout = static_cast<MemoryLayout>(layout);
  return in;
}

// The global logits of microbatch m, [rows * S_pad, V]; each rank cuts its columns.
reference::FloatMatrix global_logits(const auto& c, Eigen::Index rows, Eigen::Index padded_len,
                                     int m) {
  return random_floats(rows * padded_len, c.vocab, c.logit_scale,
                       input_seed(c.seed, Input::kLogits, m));
}

// Every microbatch: local logits cut from the global ones, loss, backward; reply value and
// gradient.
template <class Case>
std::string loss_task(const Case& c, const Sharder& sharder, const LossParams& p,
                      const MeshPtr& mesh) {
  pool::Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const LocalShard s = sharder.local(m);
    const int64_t rows = s.labels.size(0);
    const at::Tensor global = to_tensor(global_logits(c, rows, s.layout.padded_len, m))
                                  .view({rows, s.layout.padded_len, c.vocab});
    const at::Tensor logits =
        global.index_select(1, layout_positions_of(s.layout)).contiguous().requires_grad_(true);
    // Junk the loss must never read: an invalid label, a set valid bit.
    const at::Tensor labels = lay_out(s.labels, strided(p.layout), -7);
    const at::Tensor valid = lay_out(s.valid, strided(p.layout), 1);
    const at::Tensor loss = shifted_cp_loss(logits, labels, valid, mesh,
                                            {.softcap = p.softcap, .layout = s.layout.plan});
    const auto grad =
        torch::autograd::grad({loss}, {logits}, {at::full({}, p.upstream, loss.options())});
    out.add(std::to_string(m) + ".loss", loss);
    out.add(std::to_string(m) + ".grad", grad[0]);
  }
  return out.serialise();
}

const RankTask loss_bshd("loss_bshd", [](const std::string& text, const MeshPtr& mesh, int) {
  const auto [p, c] = decode_with<BshdCase, LossParams>(text);
  const Sharder s = prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      pad_of(options_of(c)));
  return loss_task(c, s, p, mesh);
});

const RankTask loss_packed("loss_packed", [](const std::string& text, const MeshPtr& mesh, int) {
  const auto [p, c] = decode_with<PackedCase, LossParams>(text);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, static_cast<int>(c.rows.size()),
                               true, pad_of(options_of(c)));
  return loss_task(c, s, p, mesh);
});

template <class Case>
void check_loss(const Case& c, const reference::Sharder& s, const RankTask& task,
                const LossParams& p) {
  RC_TAG(layout_name(p.layout));
  const auto bundles = task.run(c.cp, encode_with(p, c));
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const reference::GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    const RankLossInputs in = cut_for_ranks(global_logits(c, rows, g.padded_len, m), s, m);
    const auto ref = reference::shifted_cp_loss(in.values, in.labels, in.valid,
                                                {p.softcap, reference_layout(s, m)});
    const double zmax = static_cast<double>(c.logit_scale) * 6;  // |z| bound of the generator
    for (int r = 0; r < c.cp; ++r) {
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      const pool::Bundle& b = bundles[r];
      const double scale = ref[r].global_targets > 0 ? double(c.cp) / ref[r].global_targets : 0;
      require_near(
          b.get(std::to_string(m) + ".loss").reshape({1}), at::full({1}, ref[r].value, at::kDouble),
          loss_value_atol(zmax, c.vocab, ref[r].local_targets, scale), kLossRtol, "loss" + where);
      require_near(b.get(std::to_string(m) + ".grad").reshape({-1, c.vocab}),
                   to_tensor(ref[r].grad_logits) * p.upstream,
                   loss_grad_atol(zmax, scale) * std::abs(p.upstream), kLossRtol,
                   "logits gradient" + where);
    }
  }
}

rc::Gen<LossParams> gen_loss_params() {
  return rc::gen::exec([] {
    LossParams p;
    p.softcap = *rc::gen::element(0.0, 0.0, 30.0);
    p.upstream = *rc::gen::element(1.0, 1.0, 0.5, -3.0);
    p.layout = *gen_memory_layout();
    return p;
  });
}

void check_bshd_loss(const BshdCase& c, const LossParams& p) {
  check_loss(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), loss_bshd, p);
}

void check_packed_loss(const PackedCase& c, const LossParams& p) {
  check_loss(c, reference::prepare_packed_cp_inputs(make_batch(c), options_of(c)), loss_packed, p);
}

RC_GTEST_PROP(OptimizedLoss, BshdEqualsReference, ()) {
  check_bshd_loss(*gen_bshd_case(), *gen_loss_params());
}

RC_GTEST_PROP(OptimizedLoss, PackedEqualsReference, ()) {
  check_packed_loss(*gen_packed_case(), *gen_loss_params());
}

// Failure class: the last vocabulary block or vector tail mishandled at sizes real models
// use (short sequences keep the logits small).
RC_GTEST_PROP(OptimizedLoss, ProductionVocabularies, ()) {
  BshdCase c = *gen_bshd_case();
  c.vocab = *gen_production_vocab();
  c.cp = *rc::gen::inRange(1, 5);
  c.num_chunks = 1;
  c.rows_per_chunk = 1;
  c.seq_len = *rc::gen::inRange(1, 9);
  check_bshd_loss(c, *gen_loss_params());
}

// Failure class: the boundary label dropped when labels are shifted per shard.
RC_GTEST_PROP(OptimizedLoss, BoundaryLabelCrossesShards, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.seq_len = *rc::gen::inRange(2 * c.cp, 6 * c.cp);
  c.ignore_percent = 0;
  c.use_mask = false;
  check_bshd_loss(c, {});
}

// Failure class: the target count reduced over the wrong group (too few or too many).
RC_GTEST_PROP(OptimizedLoss, TargetsCountedOverTheWholeMesh, ()) {
  PackedCase c = *gen_packed_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.ignore_percent = 0;
  c.rows[0].push_back({*rc::gen::inRange(2 * c.cp, 40), 0});  // targets on several ranks
  check_packed_loss(c, {});
}

// Layouts (SPEC 2b): a fragment's last token takes the target of the token at its global end,
// wherever that lives; CP / N unchanged.
RC_GTEST_PROP(OptimizedLoss, EveryLayoutEqualsReference, ()) {
  BshdCase b = *gen_bshd_case();
  b.layout = *gen_bshd_layout();
  check_bshd_loss(b, *gen_loss_params());
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.cp = *rc::gen::inRange(2, 9);
  check_packed_loss(p, *gen_loss_params());
}

// Failure class: NaN when a rank (or the whole mesh) has no target.
RC_GTEST_PROP(OptimizedLoss, FiniteWhenARankHasNoTarget, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.ignore_percent = *rc::gen::element(50, 100);
  c.seq_len = *rc::gen::inRange(1, c.cp + 1);  // S <= CP: some ranks hold only padding
  check_bshd_loss(c, *gen_loss_params());
}

}  // namespace
}  // namespace cpkit::harness
