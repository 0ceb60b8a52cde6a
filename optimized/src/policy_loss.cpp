// policy_loss: targets and the aggregation's counts first (over the CP mesh, then the DP
// mesh), then per chunk of token rows: logits, each row's log-probability and entropy (the
// token_logprobs kernel), each position's d J / d lp and d J / d entropy, the logits' gradient
// in place (the token_logprobs backward kernel) and the two gradient GEMMs: three GEMMs.
// gspo first runs one logits pass for the sequence ratios.
#include "cpkit/optimized/policy_loss.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "agreement.hpp"
#include "cpkit/optimized/constants.hpp"
#include "cpkit/optimized/error.hpp"
#include "fault_injection.hpp"
#include "head_gemms.hpp"
#include "logprob_rows.hpp"
#include "loss_kernel.hpp"
#include "loss_targets.hpp"
#include "policy_terms.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

bool by_sequence(const PolicyLossOptions& o) {
  return o.kind == PolicyKind::kGspo || o.aggregation == PolicyAggregation::kSeqMeanTokenMean ||
         o.aggregation == PolicyAggregation::kSeqMeanTokenSum;
}

// A per-position input as [B * L] float64, checked: [B, L], `dtype`, hidden's device, and
// (values) finite wherever a position counts.
at::Tensor position_values(const at::Tensor& t, const char* name, const at::Tensor& targets,
                           const at::Tensor& counts, at::ScalarType dtype) {
  detail::require_defined(t, name);
  if (t.sizes() != targets.sizes() || t.scalar_type() != dtype || t.device() != targets.device())
    raise(name, "must be [B, L] = ", detail::shape_of(targets), " ", dtype, " on ",
          targets.device(), ", got ", detail::shape_of(t), " ", t.scalar_type(), " on ",
          t.device());
  if (dtype == at::kLong) return t.reshape({-1});
  const at::Tensor flat = t.reshape({-1}).to(at::kDouble);
  const at::Tensor bad = counts & ~at::isfinite(flat);
  if (bad.any().item<bool>()) {
    const int64_t at = bad.nonzero()[0][0].item<int64_t>();
    raise(name, "is ", flat[at].item<double>(), " at position ", at,
          ", which has a target: every counted position needs a finite value");
  }
  return flat;
}

// The sum over `mesh` of a float64 tensor (in place; a no-op without a mesh).
void sum_over(const MeshPtr& mesh, at::Tensor& t) {
  if (cp_size(mesh) > 1)
    mesh->all_reduce_sum(t.data_ptr(), static_cast<std::size_t>(t.numel()), ScalarKind::kFloat64);
}

// Every CP and DP rank must run the same exchanges: the kind, aggregation and optional terms
// decide them, so the ranks agree on those first (raising together if they differ).
void check_ranks_agree(const at::Tensor& hidden, const MeshPtr& mesh, const PolicyLossOptions& o) {
  const std::vector<detail::Agreed> fields{
      {"kind", "the kind", static_cast<int64_t>(o.kind)},
      {"aggregation", "the aggregation", static_cast<int64_t>(o.aggregation)},
      {"dp_mesh", "the DP size", cp_size(o.dp_mesh)},
      {"mesh", "the CP size", cp_size(mesh)},
  };
  for (const MeshPtr& m : {mesh, o.dp_mesh})
    if (cp_size(m) > 1)
      detail::exchange_agreed(at::empty({0}, hidden.options().dtype(at::kLong)), fields, *m, true,
                              "every rank must compute the same policy loss");
}

PolicyLossWithGrad fused_policy_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                     const at::Tensor& labels, const at::Tensor& valid,
                                     const MeshPtr& mesh, const PolicyLossInputs& in,
                                     const PolicyLossOptions& o, LinearLossGrads want) {
  detail::check_head_inputs(hidden, weight, o.softcap, o.chunk_rows);
  detail::check_policy_options(o);
  const detail::Targets t = detail::prepare_targets(labels, valid, hidden, "hidden", weight.size(0),
                                                    "weight", mesh, o.layout.get());
  check_ranks_agree(hidden, mesh, o);
  const at::NoGradGuard no_grad;
  const int64_t B = hidden.size(0), L = hidden.size(1), H = hidden.size(2), V = weight.size(0);
  const int64_t rows = B * L, cp = cp_size(mesh), W = cp * cp_size(o.dp_mesh);
  const at::Tensor targets = t.targets.reshape({rows});
  const at::Tensor counts = targets != kIgnoreLabel;
  // Inputs, checked before any collective that depends on them.
  detail::PolicyRange range;
  range.counts = counts;
  range.advantages = position_values(in.advantages, "advantages", t.targets, counts, at::kFloat);
  range.old_logprobs =
      position_values(in.old_logprobs, "old_logprobs", t.targets, counts, at::kFloat);
  if (o.kl_coef > 0)
    range.ref_logprobs =
        position_values(in.ref_logprobs, "ref_logprobs", t.targets, counts, at::kFloat);
  if (o.tis_cap > 0)
    range.sampler_logprobs =
        position_values(in.sampler_logprobs, "sampler_logprobs", t.targets, counts, at::kFloat);
  // Aggregation weights. Sequences are (row, id) slots of a [B, CP * L + 1] table that every
  // CP rank fills with its counted positions and sums over the mesh.
  const auto f64 = hidden.options().dtype(at::kDouble);
  at::Tensor key, per_sequence;
  double denominator = 1.0;
  if (by_sequence(o)) {
    const at::Tensor ids =
        position_values(in.sequence_ids, "sequence_ids", t.targets, counts, at::kLong);
    const int64_t slots = cp * L + 1;
    const at::Tensor bad = counts & ((ids <= 0) | (ids >= slots));
    if (bad.any().item<bool>())
      raise("sequence_ids", "is ", ids[bad.nonzero()[0][0]].item<int64_t>(),
            " at a position with a target: ids must be in [1, ", slots - 1,
            "] there (the shard's document_ids)");
    key = at::arange(rows, ids.options()).div(L, "floor") * slots + ids.clamp(0, slots - 1);
    per_sequence = at::zeros({B * slots}, f64).index_add_(0, key, counts.to(at::kDouble));
    sum_over(mesh, per_sequence);
  }
  if (o.aggregation == PolicyAggregation::kTokenMean) {
    at::Tensor n = t.count.to(at::kDouble).reshape({1});
    sum_over(o.dp_mesh, n);
    denominator = n.item<double>();
  } else if (o.aggregation == PolicyAggregation::kConstant) {
    denominator = o.divisor;
  } else {
    at::Tensor sequences = (per_sequence > 0).sum().to(at::kDouble).reshape({1});
    sum_over(o.dp_mesh, sequences);
    denominator = sequences.item<double>();
  }
  at::Tensor w = counts.to(at::kDouble) / std::max(denominator, 1.0);
  if (o.aggregation == PolicyAggregation::kSeqMeanTokenMean)
    w = w / per_sequence.index_select(0, key).clamp_min(1.0);
  range.w = w;

  const detail::HeadGemms head(hidden.reshape({rows, H}), weight, o.logits_precision, o.chunk_rows,
                               detail::kLogprobCpuChunkBytes);
  const auto f32 = hidden.options().dtype(at::kFloat);
  const at::Tensor stats = at::empty({rows, 3}, f32);
  // The entropy (and the kernels' centred sums) only where it is returned or in the objective.
  const bool with_entropy = o.entropy || o.entropy_coef != 0.0;
  at::Tensor lp = at::empty({rows}, f32), entropy = at::zeros({rows}, f32);
  auto logprobs_of = [&](const at::Tensor& z, int64_t begin) {
    kernels::TokenLogprobsArgs a =
        detail::logprob_rows(z, targets, stats, begin, o.softcap, o.temperature);
    a.logprobs = lp.data_ptr<float>() + begin;
    a.entropy = with_entropy ? entropy.data_ptr<float>() + begin : nullptr;
    a.centred = with_entropy;
    detail::logprob_rows_forward(a, z);
    return a;
  };
  // gspo: every position's log-probability first, then each sequence's ratio and d J / d R.
  detail::PolicyTerms whole;
  if (o.kind == PolicyKind::kGspo) {
    for (int64_t begin = 0; begin < rows; begin += head.chunk())
      logprobs_of(head.logits(begin, std::min(head.chunk(), rows - begin)), begin);
    const at::Tensor delta =
        at::where(counts, lp.to(at::kDouble) - range.old_logprobs, at::zeros({rows}, f64));
    at::Tensor sums = at::zeros_like(per_sequence).index_add_(0, key, delta);
    if (!detail::fault("sequence_ratio_local_only")) sum_over(mesh, sums);
    const at::Tensor n = per_sequence.index_select(0, key).clamp_min(1.0);
    range.sequence_ratio = at::exp(sums.index_select(0, key) / n);
    range.lp = lp.to(at::kDouble);
    range.entropy = entropy.to(at::kDouble);
    whole = detail::policy_terms(range, o);
    at::Tensor slope = at::zeros_like(per_sequence).index_add_(0, key, whole.sequence_slope);
    sum_over(mesh, slope);
    whole.g_lp = whole.g_lp + slope.index_select(0, key) * range.sequence_ratio / n;
  }
  // The fused pass.
  at::Tensor weighted = at::zeros({rows}, f64), ratio = at::zeros({rows}, f64);
  at::Tensor clipped = at::zeros({rows}, f64), kl = at::zeros({rows}, f64);
  at::Tensor g_lp = at::empty({rows}, f32), g_ent = at::empty({rows}, f32);
  at::Tensor grad_hidden = want.hidden ? at::empty({rows, H}, hidden.options()) : at::Tensor();
  at::Tensor grad_weight = want.weight ? at::empty({V, H}, f32) : at::Tensor();
  for (int64_t begin = 0; begin < rows; begin += head.chunk()) {
    const int64_t n = std::min(head.chunk(), rows - begin);
    const at::Tensor z = head.logits(begin, n);
    kernels::TokenLogprobsArgs a = logprobs_of(z, begin);
    detail::PolicyTerms part;
    if (o.kind == PolicyKind::kGspo) {
      auto slice = [&](const at::Tensor& x) { return x.narrow(0, begin, n); };
      part = {slice(whole.weighted), slice(whole.g_lp), slice(whole.g_ent), slice(whole.ratio),
              slice(whole.clipped),  slice(whole.kl),   at::Tensor()};
    } else {
      auto slice = [&](const at::Tensor& x) { return x.defined() ? x.narrow(0, begin, n) : x; };
      detail::PolicyRange chunk{slice(lp).to(at::kDouble),
                                slice(entropy).to(at::kDouble),
                                slice(range.advantages),
                                slice(range.old_logprobs),
                                slice(range.ref_logprobs),
                                slice(range.sampler_logprobs),
                                slice(range.w),
                                slice(counts),
                                at::Tensor()};
      part = detail::policy_terms(chunk, o);
    }
    weighted.narrow(0, begin, n).copy_(part.weighted);
    ratio.narrow(0, begin, n).copy_(part.ratio);
    clipped.narrow(0, begin, n).copy_(part.clipped);
    kl.narrow(0, begin, n).copy_(part.kl);
    // Each rank's gradient is W times its positions' share of d J (spec 5c).
    g_lp.narrow(0, begin, n).copy_(part.g_lp * static_cast<double>(W));
    g_ent.narrow(0, begin, n).copy_(part.g_ent * static_cast<double>(W));
    if (!want.hidden && !want.weight) continue;
    a.grad_logprobs = g_lp.data_ptr<float>() + begin;
    a.grad_entropy = o.entropy_coef != 0.0 ? g_ent.data_ptr<float>() + begin : nullptr;
    a.grad = z.data_ptr<float>();
    detail::logprob_rows_backward(a, z);
    const at::Tensor g = head.gradient_operand(z);
    if (want.hidden) head.grad_hidden(g, grad_hidden.narrow(0, begin, n));
    if (want.weight) head.accumulate_grad_weight(grad_weight, g, begin, begin == 0);
  }
  PolicyLossWithGrad out;
  auto per_position = [&](const at::Tensor& x) {
    return at::where(counts, x.to(at::kFloat), at::zeros({rows}, f32)).view({B, L});
  };
  out.values.loss = (weighted.sum() * static_cast<double>(W)).to(at::kFloat);
  out.values.logprobs = per_position(lp);
  out.values.ratio = per_position(ratio);
  out.values.clipped = per_position(clipped);
  out.values.kl = per_position(kl);
  out.values.entropy = per_position(entropy);
  if (want.hidden) out.grad_hidden = grad_hidden.view(hidden.sizes());
  if (want.weight) out.grad_weight = grad_weight.to(weight.scalar_type());
  return out;
}

class PolicyLossFunction : public torch::autograd::Function<PolicyLossFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& labels, const at::Tensor& valid,
                                                const MeshPtr& mesh, const PolicyLossInputs& inputs,
                                                const PolicyLossOptions& options,
                                                LinearLossGrads want) {
    PolicyLossWithGrad r = fused_policy_loss(hidden.detach(), weight.detach(), labels, valid, mesh,
                                             inputs, options, want);
    ctx->save_for_backward({r.grad_hidden, r.grad_weight});
    const PolicyLoss& v = r.values;
    ctx->mark_non_differentiable({v.logprobs, v.ratio, v.clipped, v.kl, v.entropy});
    return {v.loss, v.logprobs, v.ratio, v.clipped, v.kl, v.entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto scaled = [&](const at::Tensor& g) {
      return g.defined() && grads[0].defined() ? detail::times_upstream(g, grads[0]) : at::Tensor();
    };
    return {scaled(saved[0]), scaled(saved[1]), at::Tensor(), at::Tensor(),
            at::Tensor(),     at::Tensor(),     at::Tensor(), at::Tensor()};
  }
};

}  // namespace

PolicyKind parse_policy_kind(const std::string& name) {
  if (name == "ppo") return PolicyKind::kPpo;
  if (name == "cispo") return PolicyKind::kCispo;
  if (name == "gspo") return PolicyKind::kGspo;
  raise("kind", "must be ppo, cispo or gspo, got \"", name, "\"");
}

KlEstimator parse_kl_estimator(const std::string& name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k2") return KlEstimator::kK2;
  if (name == "k3") return KlEstimator::kK3;
  raise("kl", "must be k1, k2 or k3, got \"", name, "\"");
}

PolicyAggregation parse_policy_aggregation(const std::string& name) {
  if (name == "token_mean") return PolicyAggregation::kTokenMean;
  if (name == "seq_mean_token_mean") return PolicyAggregation::kSeqMeanTokenMean;
  if (name == "seq_mean_token_sum") return PolicyAggregation::kSeqMeanTokenSum;
  if (name == "constant") return PolicyAggregation::kConstant;
  raise("aggregation",
        "must be token_mean, seq_mean_token_mean, seq_mean_token_sum or constant, got \"", name,
        "\"");
}

PolicyLoss policy_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                       const at::Tensor& valid, const MeshPtr& mesh, const PolicyLossInputs& inputs,
                       const PolicyLossOptions& options) {
  // Only the gradients autograd will ask for: a frozen head costs no d weight GEMM.
  const bool grad_on = at::GradMode::is_enabled();
  const auto outs =
      PolicyLossFunction::apply(hidden, weight, labels, valid, mesh, inputs, options,
                                LinearLossGrads{.hidden = grad_on && hidden.requires_grad(),
                                                .weight = grad_on && weight.requires_grad()});
  return {outs[0], outs[1], outs[2], outs[3], outs[4], outs[5]};
}

PolicyLossWithGrad policy_loss_with_grad(const at::Tensor& hidden, const at::Tensor& weight,
                                         const at::Tensor& labels, const at::Tensor& valid,
                                         const MeshPtr& mesh, const PolicyLossInputs& inputs,
                                         const PolicyLossOptions& options, LinearLossGrads want) {
  const at::NoGradGuard no_grad;
  return fused_policy_loss(hidden.detach(), weight.detach(), labels, valid, mesh, inputs, options,
                           want);
}

}  // namespace cpkit
