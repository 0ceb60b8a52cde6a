// SPEC 5a on the optimized path in real rank processes: shifted_cp_linear_loss (the LM head
// fused into the loss, a chunk of rows at a time) against the reference's full logits, for
// BSHD and packed batches, soft cap on and off, chunks that do and do not divide the rows,
// either gradient alone, upstream gradients other than 1.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_task.hpp"
#include "tolerances.hpp"

namespace cpkit::harness {
namespace {

enum class Wanted : int { kBoth, kHidden, kWeight };

// What a linear-loss case adds to its batch.
struct LinearParams {
  int hidden = 1;         // H
  double head_scale = 1;  // logits ~ N(0, head_scale^2)
  double softcap = 0;
  double upstream = 1;
  int chunk_rows = 0;  // 0: the default
  Wanted wanted = Wanted::kBoth;
  bool contiguous_hidden = false;  // else the rank's columns of the global [B, S, H], strided
};

std::ostream& operator<<(std::ostream& os, const LinearParams& p) {
  return os << p.hidden << "," << p.head_scale << "," << p.softcap << "," << p.upstream << ","
            << p.chunk_rows << "," << static_cast<int>(p.wanted) << "," << p.contiguous_hidden;
}

std::istream& operator>>(std::istream& in, LinearParams& p) {
  std::string text;
  in >> text;
  int wanted = 0, contiguous = 0;
  std::sscanf(text.c_str(), "%d,%lf,%lf,%lf,%d,%d,%d", &p.hidden, &p.head_scale, &p.softcap,
              &p.upstream, &p.chunk_rows, &wanted, &contiguous);
  p.wanted = static_cast<Wanted>(wanted);
  p.contiguous_hidden = contiguous != 0;
  return in;
}

// The global hidden states of microbatch m, [rows * S_pad, H], N(0, 1).
reference::FloatMatrix global_hidden(const auto& c, const LinearParams& p, Eigen::Index rows,
                                     Eigen::Index padded_len, int m) {
  return random_floats(rows * padded_len, p.hidden, 1.0f, input_seed(c.seed, Input::kHidden, m));
}

// The head [V, H], N(0, head_scale^2 / H): logits of scale head_scale.
reference::FloatMatrix head_weight(const auto& c, const LinearParams& p) {
  return random_floats(c.vocab, p.hidden, static_cast<float>(p.head_scale / std::sqrt(p.hidden)),
                       input_seed(c.seed, Input::kHeadWeight));
}

template <class Case>
std::string linear_task(const Case& c, const Sharder& sharder, const LinearParams& p,
                        const MeshPtr& mesh) {
  pool::Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const LocalShard s = sharder.local(m);
    const int64_t rows = s.labels.size(0);
    const at::Tensor global = to_tensor(global_hidden(c, p, rows, s.layout.padded_len, m))
                                  .view({rows, s.layout.padded_len, p.hidden});
    // One fragment: a (non-contiguous) view of the global rows; several: their tokens.
    at::Tensor hidden = s.layout.fragments.size() == 1
                            ? global.narrow(1, s.layout.fragments.front().begin, s.layout.local_len)
                            : global.index_select(1, layout_positions_of(s.layout));
    if (p.contiguous_hidden) hidden = hidden.contiguous();
    const at::Tensor weight = to_tensor(head_weight(c, p));
    hidden.requires_grad_(p.wanted != Wanted::kWeight);
    weight.requires_grad_(p.wanted != Wanted::kHidden);
    LinearLossOptions options;
    options.softcap = p.softcap;
    options.chunk_rows = p.chunk_rows;
    options.layout = s.layout.plan;
    const at::Tensor loss =
        shifted_cp_linear_loss(hidden, weight, s.labels, s.valid, mesh, options);
    const at::Tensor upstream = at::full({}, p.upstream, loss.options());
    const std::string key = std::to_string(m);
    out.add(key + ".loss", loss);
    if (p.wanted != Wanted::kWeight)
      out.add(key + ".dhidden", torch::autograd::grad({loss}, {hidden}, {upstream}, true)[0]);
    if (p.wanted != Wanted::kHidden)
      out.add(key + ".dweight", torch::autograd::grad({loss}, {weight}, {upstream})[0]);
  }
  return out.serialise();
}

const RankTask linear_loss_bshd("linear_loss_bshd", [](const std::string& text, const MeshPtr& mesh,
                                                       int) {
  const auto [p, c] = decode_with<BshdCase, LinearParams>(text);
  const Sharder s = prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      pad_of(options_of(c)));
  return linear_task(c, s, p, mesh);
});

const RankTask linear_loss_packed("linear_loss_packed", [](const std::string& text,
                                                           const MeshPtr& mesh, int) {
  const auto [p, c] = decode_with<PackedCase, LinearParams>(text);
  const Sharder s =
      prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh, static_cast<int>(c.rows.size()),
                               true, pad_of(options_of(c)));
  return linear_task(c, s, p, mesh);
});

template <class Case>
void check_linear_loss(const Case& c, const reference::Sharder& s, const RankTask& task,
                       const LinearParams& p) {
  const auto bundles = task.run(c.cp, encode_with(p, c));
  const reference::FloatMatrix weight = head_weight(c, p);
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const reference::GlobalStreams& g = s.global(m);
    const auto rows = g.labels.rows();
    const reference::FloatMatrix global = global_hidden(c, p, rows, g.padded_len, m);
    const RankLossInputs in = cut_for_ranks(global, s, m);
    const auto ref = reference::shifted_cp_linear_loss(in.values, weight, in.labels, in.valid,
                                                       {p.softcap, reference_layout(s, m)});
    // Float error of one logit (a length-H dot product), then the loss's own bounds at the
    // generator's |z| bound; a gradient row sums V (d hidden) or the rows (d weight) of them.
    const double wmax = weight.cwiseAbs().maxCoeff(), hmax = global.cwiseAbs().maxCoeff();
    const double logit_err = 2 * kEps * p.hidden * wmax * hmax;
    const double zmax = 6 * p.head_scale;
    for (int r = 0; r < c.cp; ++r) {
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      const pool::Bundle& b = bundles[r];
      const double scale = ref[r].global_targets > 0 ? double(c.cp) / ref[r].global_targets : 0;
      const double up = std::abs(p.upstream);
      const double grad_err = loss_grad_atol(zmax, scale) + 2 * logit_err * scale;
      const std::string key = std::to_string(m);
      require_near(b.get(key + ".loss").reshape({1}), at::full({1}, ref[r].value, at::kDouble),
                   loss_value_atol(zmax, c.vocab, ref[r].local_targets, scale) +
                       2 * logit_err * ref[r].local_targets * scale,
                   kLossRtol, "loss" + where);
      if (p.wanted != Wanted::kWeight)
        require_near(b.get(key + ".dhidden").reshape({-1, p.hidden}),
                     to_tensor(ref[r].grad_hidden) * p.upstream,
                     grad_err * c.vocab * wmax * up + 1e-12, 1e-4, "d hidden" + where);
      if (p.wanted != Wanted::kHidden)
        require_near(b.get(key + ".dweight"), to_tensor(ref[r].grad_weight) * p.upstream,
                     grad_err * static_cast<double>(in.values[r].rows()) * hmax * up + 1e-12, 1e-4,
                     "d weight" + where);
    }
  }
}

rc::Gen<LinearParams> gen_linear_params() {
  return rc::gen::exec([] {
    LinearParams p;
    p.hidden = *rc::gen::element(1, 4, 16, *rc::gen::inRange(1, 49));
    p.head_scale = *rc::gen::element(1.0, 3.0, 30.0);
    p.softcap = *rc::gen::element(0.0, 0.0, 5.0, 30.0);
    p.upstream = *rc::gen::element(1.0, 1.0, 0.5, -3.0);
    p.chunk_rows = *rc::gen::element(0, 1, *rc::gen::inRange(1, 40));
    p.wanted = *rc::gen::element(Wanted::kBoth, Wanted::kBoth, Wanted::kHidden, Wanted::kWeight);
    p.contiguous_hidden = *rc::gen::arbitrary<bool>();
    return p;
  });
}

void check_bshd(const BshdCase& c, const LinearParams& p) {
  check_linear_loss(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), linear_loss_bshd,
                    p);
}

void check_packed(const PackedCase& c, const LinearParams& p) {
  check_linear_loss(c, reference::prepare_packed_cp_inputs(make_batch(c), options_of(c)),
                    linear_loss_packed, p);
}

RC_GTEST_PROP(OptimizedLinearLoss, BshdEqualsReference, ()) {
  check_bshd(*gen_bshd_case(), *gen_linear_params());
}

RC_GTEST_PROP(OptimizedLinearLoss, PackedEqualsReference, ()) {
  check_packed(*gen_packed_case(), *gen_linear_params());
}

// Failure class: a chunk boundary that drops or repeats rows (the last, short chunk; a row
// whose target is the next rank's first label falling at a chunk's end).
RC_GTEST_PROP(OptimizedLinearLoss, ChunkBoundariesAnywhere, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.seq_len = *rc::gen::inRange(2 * c.cp, 8 * c.cp);
  c.ignore_percent = 0;
  LinearParams p = *gen_linear_params();
  p.chunk_rows = *rc::gen::inRange(1, c.rows_per_chunk * c.seq_len + 2);
  check_bshd(c, p);
}

// Layouts (SPEC 2b): the fused head's halo follows the fragments, as the loss's does.
RC_GTEST_PROP(OptimizedLinearLoss, EveryLayoutEqualsReference, ()) {
  BshdCase b = *gen_bshd_case();
  b.layout = *gen_bshd_layout();
  check_bshd(b, *gen_linear_params());
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.cp = *rc::gen::inRange(2, 9);
  check_packed(p, *gen_linear_params());
}

// Failure class: NaN or a stray gradient when a rank (or the whole mesh) has no target.
RC_GTEST_PROP(OptimizedLinearLoss, FiniteWhenARankHasNoTarget, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.ignore_percent = *rc::gen::element(50, 100);
  c.seq_len = *rc::gen::inRange(1, c.cp + 1);  // S <= CP: some ranks hold only padding
  check_bshd(c, *gen_linear_params());
}

}  // namespace
}  // namespace cpkit::harness
