// docs/spec.md section 5 for the reference: the mean over ranks of shifted_cp_loss, and of its
// logits gradient, equals the single-device HF shifted mean CE, for BSHD and packed documents.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

// Both sides evaluate each row's CE with the same double formula; only sum order differs.
constexpr double kLossRtol = 1e-9;
// grad_r / CP vs the truth: one float rounding of each, so about one ulp apart.
constexpr double kGradAtol = 1e-12;
constexpr double kGradRtol = 1e-6;

// Rows [first, first + rows) of the logits of a [rows_total, S_pad, V] tensor, columns cut.
FloatMatrix logits_cut(const FloatMatrix& logits, Eigen::Index rows, Eigen::Index padded_len,
                       Eigen::Index begin, Eigen::Index len) {
  FloatMatrix out(rows * len, logits.cols());
  for (Eigen::Index b = 0; b < rows; ++b)
    out.middleRows(b * len, len) = logits.middleRows(b * padded_len + begin, len);
  return out;
}

// Runs the CP loss on every rank of microbatch m and compares with the truth.
void check_against_truth(const Sharder& s, int m, const FloatMatrix& logits,
                         const IntMatrix& truth_labels, const LossOptions& options) {
  const GlobalStreams& g = s.global(m);
  const auto rows = g.labels.rows();
  const int cp = s.options().cp_size;
  std::vector<FloatMatrix> local_logits;
  std::vector<IntMatrix> labels;
  std::vector<BoolVector> valid;
  for (int r = 0; r < cp; ++r) {
    const LocalShard l = s.local(m, r);
    local_logits.push_back(
        logits_cut(logits, rows, g.padded_len, l.layout.begin, l.layout.local_len));
    labels.push_back(l.labels);
    valid.push_back(l.valid);
  }
  const auto losses = shifted_cp_loss(local_logits, labels, valid, options);
  const MeanLoss truth = single_device_shifted_loss(
      logits_cut(logits, rows, g.padded_len, 0, g.seq_len), truth_labels, options);

  double mean = 0;
  std::int64_t counted = 0;
  for (const auto& l : losses) {
    RC_ASSERT(std::isfinite(l.value));
    mean += l.value / cp;
    counted += l.local_targets;
    RC_ASSERT(l.global_targets == truth.targets);
  }
  RC_ASSERT(counted == truth.targets);
  RC_ASSERT(std::abs(mean - truth.value) <= kLossRtol * (1 + std::abs(truth.value)));
  if (truth.targets == 0) {
    for (const auto& l : losses) RC_ASSERT(l.value == 0.0 && l.grad_logits.isZero());
  }
  // d(mean over ranks)/d logits_r = grad_r / CP equals the truth gradient cut to rank r,
  // and is zero on padded positions the truth never sees.
  for (int r = 0; r < cp; ++r) {
    const Layout l = s.layout(m, r);
    for (Eigen::Index b = 0; b < rows; ++b)
      for (Eigen::Index j = 0; j < l.local_len; ++j) {
        const auto t = l.begin + j;
        const FloatMatrix mine = losses[r].grad_logits.row(b * l.local_len + j) / cp;
        const FloatMatrix expected = t < g.seq_len
                                         ? FloatMatrix(truth.grad_logits.row(b * g.seq_len + t))
                                         : FloatMatrix::Zero(1, logits.cols());
        const std::string e = mismatch(mine, expected, kGradAtol, kGradRtol);
        if (!e.empty())
          RC_FAIL("gradient " + e + " on rank " + std::to_string(r) + " row " + std::to_string(b) +
                  " position " + std::to_string(t));
      }
  }
}

rc::Gen<LossOptions> gen_loss_options() {
  return rc::gen::map(rc::gen::element(0.0, 0.0, 30.0), [](double c) { return LossOptions{c}; });
}

RC_GTEST_PROP(ReferenceLoss, BshdMeanOverRanksEqualsSingleDevice, ()) {
  const BshdCase c = *gen_bshd_case();
  const LossOptions options = *gen_loss_options();
  const BshdBatch batch = make_batch(c);
  const Sharder s = prepare_cp_inputs(batch, options_of(c));
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    // HF truth labels: the input's, with -100 wherever attention_mask is 0.
    IntMatrix truth = batch.labels.middleRows(m * rows, rows);
    if (batch.attention_mask)
      for (Eigen::Index b = 0; b < rows; ++b)
        for (Eigen::Index t = 0; t < g.seq_len; ++t)
          if ((*batch.attention_mask)(m * rows + b, t) == 0) truth(b, t) = kIgnoreLabel;
    const FloatMatrix logits = random_floats(rows * g.padded_len, c.vocab, c.logit_scale,
                                             input_seed(c.seed, Input::kLogits, m));
    check_against_truth(s, m, logits, truth, options);
  }
}

RC_GTEST_PROP(ReferenceLoss, PackedMeanOverRanksEqualsSingleDevice, ()) {
  const PackedCase c = *gen_packed_case();
  const LossOptions options = *gen_loss_options();
  const PackedBatch batch = make_batch(c);
  const Sharder s = prepare_packed_cp_inputs(batch, options_of(c));
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const GlobalStreams& g = s.global(m);
    // HF truth labels for a packed row (as DataCollatorWithFlattening writes them): -100 on
    // every document's first token, on slot padding and on the row tail.
    IntMatrix truth = IntMatrix::Constant(1, g.seq_len, kIgnoreLabel);
    Eigen::Index t = 0;
    for (const Doc& d : c.rows[m]) {
      for (int i = 0; i < d.length; ++i, ++t)
        if (i > 0) truth(0, t) = batch.labels(m, t);
      t += d.extra;
    }
    const FloatMatrix logits =
        random_floats(g.padded_len, c.vocab, c.logit_scale, input_seed(c.seed, Input::kLogits, m));
    check_against_truth(s, m, logits, truth, options);
  }
}

RC_GTEST_PROP(ReferenceLoss, NoTargetsGivesExactZero, ()) {
  BshdCase c = *gen_bshd_case();
  c.ignore_percent = 100;
  const Sharder s = prepare_cp_inputs(make_batch(c), options_of(c));
  const Layout l = s.layout(0, 0);
  std::vector<FloatMatrix> logits;
  std::vector<IntMatrix> labels;
  std::vector<BoolVector> valid;
  for (int r = 0; r < c.cp; ++r) {
    const LocalShard shard = s.local(0, r);
    logits.push_back(random_floats(shard.labels.rows() * l.local_len, c.vocab, c.logit_scale,
                                   input_seed(c.seed, Input::kLogits, r)));
    labels.push_back(shard.labels);
    valid.push_back(shard.valid);
  }
  for (const auto& loss : shifted_cp_loss(logits, labels, valid)) {
    RC_ASSERT(loss.value == 0.0);
    RC_ASSERT(loss.global_targets == 0);
    RC_ASSERT(loss.grad_logits.isZero());
  }
}

// The truth's own gradient, against central differences, with and without softcap. Caps
// as small as the logits (c in [1, 5] against |z| up to ~20) make the cap's chain rule
// matter: evaluated at the capped value instead of z, it is off by far more than 1e-3.
RC_GTEST_PROP(ReferenceLoss, GradientMatchesFiniteDifferences, ()) {
  const int S = *rc::gen::inRange(2, 6);
  const int V = *rc::gen::inRange(2, 6);
  const LossOptions options{*rc::gen::element(0.0, 30.0, 1.0, 2.5, 5.0)};
  const float scale = *rc::gen::element(1.0f, 3.0f, 6.0f);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  FloatMatrix logits = random_floats(S, V, scale, seed);
  IntMatrix labels(1, S);
  for (int t = 0; t < S; ++t) labels(0, t) = *rc::gen::inRange(0, V);
  const MeanLoss base = single_device_shifted_loss(logits, labels, options);
  const auto i = *rc::gen::inRange(0, S);
  const auto j = *rc::gen::inRange(0, V);
  const float h = 1e-2f;
  const float saved = logits(i, j);
  logits(i, j) = saved + h;
  const double up = single_device_shifted_loss(logits, labels, options).value;
  logits(i, j) = saved - h;
  const double down = single_device_shifted_loss(logits, labels, options).value;
  const double numeric = (up - down) / (2 * h);
  RC_ASSERT(std::abs(numeric - base.grad_logits(i, j)) <= 1e-3 * (1 + std::abs(numeric)));
}

}  // namespace
}  // namespace cpkit::harness
