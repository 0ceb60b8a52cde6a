// policy_loss's per-position arithmetic (policy_terms.hpp).
#include "policy_terms.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "cpkit/optimized/error.hpp"

namespace cpkit::detail {

namespace {

// The clipped surrogate max(-A r, -A clip(r)) and the dual clip: value, d / d r, clipped.
struct Surrogate {
  at::Tensor value, slope, clipped;
};

Surrogate surrogate(const at::Tensor& a, const at::Tensor& r, const PolicyLossOptions& o) {
  const at::Tensor plain = -a * r;
  const at::Tensor held = -a * r.clamp(1.0 - o.eps_low, 1.0 + o.eps_high);
  Surrogate s{at::maximum(plain, held), at::where(plain >= held, -a, at::zeros_like(a)),
              held > plain};
  if (o.dual_clip > 1) {
    const at::Tensor floor = -o.dual_clip * a;
    const at::Tensor dual = (a < 0) & (floor < s.value);
    s.value = at::where(dual, floor, s.value);
    s.slope = at::where(dual, at::zeros_like(a), s.slope);
    s.clipped = s.clipped | dual;
  }
  return s;
}

}  // namespace

void check_policy_options(const PolicyLossOptions& o) {
  if (!(o.eps_low >= 0 && o.eps_low < 1)) raise("eps_low", "must be in [0, 1), got ", o.eps_low);
  if (!(o.eps_high >= 0) || !std::isfinite(o.eps_high))
    raise("eps_high", "must be finite and >= 0, got ", o.eps_high);
  if (!(o.dual_clip == 0 || o.dual_clip > 1) || !std::isfinite(o.dual_clip))
    raise("dual_clip", "must be 0 (off) or > 1, got ", o.dual_clip);
  for (const auto& [value, name] :
       {std::pair{o.kl_coef, "kl_coef"}, {o.tis_cap, "tis_cap"}, {o.entropy_coef, "entropy_coef"}})
    if (!(value >= 0) || !std::isfinite(value)) raise(name, "must be finite and >= 0, got ", value);
  if (o.aggregation == PolicyAggregation::kConstant && !(o.divisor > 0 && std::isfinite(o.divisor)))
    raise("divisor", "must be finite and > 0 with the constant aggregation, got ", o.divisor);
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature))
    raise("temperature", "must be finite and > 0, got ", o.temperature);
}

PolicyTerms policy_terms(const PolicyRange& x, const PolicyLossOptions& o) {
  const at::Tensor counts = x.counts;
  const at::Tensor zero = at::zeros_like(x.lp);
  auto only = [&](const at::Tensor& t) { return at::where(counts, t, zero); };
  const at::Tensor lp = only(x.lp), a = only(x.advantages), old = only(x.old_logprobs);
  const at::Tensor r =
      x.sequence_ratio.defined() ? only(x.sequence_ratio) : only(at::exp(lp - old));
  const at::Tensor tis = o.tis_cap > 0
                             ? only(at::exp(old - only(x.sampler_logprobs)).clamp_max(o.tis_cap))
                             : at::ones_like(lp);
  PolicyTerms t;
  at::Tensor pg, dpg_dlp = zero;
  if (o.kind == PolicyKind::kCispo) {
    const at::Tensor held = r.clamp(1.0 - o.eps_low, 1.0 + o.eps_high);
    pg = -held * a * lp;
    dpg_dlp = -held * a;
    t.clipped = held != r;
  } else {
    const Surrogate s = surrogate(a, r, o);
    pg = s.value;
    t.clipped = s.clipped;
    if (o.kind == PolicyKind::kPpo)
      dpg_dlp = s.slope * r;
    else
      t.sequence_slope = only(x.w * tis * s.slope);
  }
  at::Tensor kl = zero, dkl_dlp = zero;
  if (o.kl_coef > 0) {
    const at::Tensor d = only(x.ref_logprobs) - lp;
    switch (o.kl) {
      case KlEstimator::kK1:
        kl = -d;
        dkl_dlp = at::ones_like(d);
        break;
      case KlEstimator::kK2:
        kl = d * d / 2;
        dkl_dlp = -d;
        break;
      case KlEstimator::kK3:
        kl = at::exp(d) - d - 1;
        dkl_dlp = 1 - at::exp(d);
        break;
    }
  }
  const at::Tensor ent = only(x.entropy);
  t.weighted = only(x.w * (tis * pg + o.kl_coef * kl - o.entropy_coef * ent));
  t.g_lp = only(x.w * (tis * dpg_dlp + o.kl_coef * dkl_dlp));
  t.g_ent = only(-x.w * o.entropy_coef);
  t.ratio = r;
  t.clipped = (t.clipped & counts).to(lp.scalar_type());
  t.kl = only(kl);
  return t;
}

}  // namespace cpkit::detail
