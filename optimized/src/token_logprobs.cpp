// token_logprobs: targets once (the loss's shift, halo and layouts), then per chunk of token
// rows the head's logits into one reused fp32 buffer and a kernel that reduces each row to
// its log-probability, entropy and saved statistics. The backward recomputes each chunk's
// logits, turns them into their gradient in place and folds it into d hidden and d weight.
#include "cpkit/optimized/token_logprobs.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "cpkit/optimized/constants.hpp"
#include "cpkit/optimized/error.hpp"
#include "fault_injection.hpp"
#include "head_gemms.hpp"
#include "logprob_rows.hpp"
#include "loss_targets.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

void check_options(const at::Tensor& hidden, const at::Tensor& weight,
                   const TokenLogprobsOptions& options) {
  detail::check_head_inputs(hidden, weight, options.softcap, options.chunk_rows);
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature))
    raise("temperature", "must be finite and > 0, got ", options.temperature);
}

// An upstream gradient [B, L] as the kernel reads it: fp32, contiguous, on hidden's device.
at::Tensor upstream_rows(const at::Tensor& g, const at::Tensor& targets, const char* name) {
  detail::require_defined(g, name);
  if (g.sizes() != targets.sizes())
    raise(name, "must be [B, L] = ", detail::shape_of(targets), ", got ", detail::shape_of(g));
  if (g.device() != targets.device())
    raise(name, "is on ", g.device(), " but hidden is on ", targets.device());
  return g.to(at::kFloat).contiguous().reshape({-1});
}

class TokenLogprobsFunction : public torch::autograd::Function<TokenLogprobsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& labels, const at::Tensor& valid,
                                                const MeshPtr& mesh,
                                                const TokenLogprobsOptions& options) {
    TokenLogprobsForward f = token_logprobs_forward(hidden, weight, labels, valid, mesh, options);
    ctx->save_for_backward({hidden, weight, f.targets, f.stats});
    ctx->saved_data["softcap"] = options.softcap;
    ctx->saved_data["temperature"] = options.temperature;
    ctx->saved_data["fp32"] = options.logits_precision == LogitsPrecision::kFp32;
    ctx->saved_data["chunk_rows"] = options.chunk_rows;
    ctx->saved_data["entropy"] = options.entropy;
    ctx->mark_non_differentiable({f.values.has_target});
    ctx->set_materialize_grads(false);  // an unused output's upstream arrives undefined: zero
    const at::Tensor entropy =
        options.entropy ? f.values.entropy : at::zeros_like(f.values.logprobs);
    return {f.values.logprobs, entropy, f.values.has_target};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    TokenLogprobsOptions options;
    options.softcap = ctx->saved_data["softcap"].toDouble();
    options.temperature = ctx->saved_data["temperature"].toDouble();
    options.logits_precision =
        ctx->saved_data["fp32"].toBool() ? LogitsPrecision::kFp32 : LogitsPrecision::kInput;
    options.chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const TokenLogprobsGrads g =
        token_logprobs_backward(saved[0], saved[1], saved[2], saved[3], grads[0],
                                ctx->saved_data["entropy"].toBool() ? grads[1] : at::Tensor(),
                                options, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {g.hidden, g.weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

TokenLogprobsForward token_logprobs_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& labels, const at::Tensor& valid,
                                            const MeshPtr& mesh,
                                            const TokenLogprobsOptions& options) {
  check_options(hidden, weight, options);
  const detail::Targets t = detail::prepare_targets(labels, valid, hidden, "hidden", weight.size(0),
                                                    "weight", mesh, options.layout.get());
  const at::NoGradGuard no_grad;
  const int64_t B = hidden.size(0), L = hidden.size(1), H = hidden.size(2);
  const int64_t rows = B * L;
  const detail::HeadGemms head(hidden.detach().reshape({rows, H}), weight.detach(),
                               options.logits_precision, options.chunk_rows,
                               detail::kLogprobCpuChunkBytes);
  const auto f32 = hidden.options().dtype(at::kFloat);
  const at::Tensor targets = t.targets.reshape({rows});
  TokenLogprobsForward out;
  out.targets = t.targets;
  out.stats = at::empty({rows, 3}, f32);
  at::Tensor logprobs = at::empty({rows}, f32);
  at::Tensor entropy = options.entropy ? at::empty({rows}, f32) : at::Tensor();
  for (int64_t begin = 0; begin < rows; begin += head.chunk()) {
    const at::Tensor z = head.logits(begin, std::min(head.chunk(), rows - begin));
    kernels::TokenLogprobsArgs a =
        detail::logprob_rows(z, targets, out.stats, begin, options.softcap, options.temperature);
    a.logprobs = logprobs.data_ptr<float>() + begin;
    a.entropy = options.entropy ? entropy.data_ptr<float>() + begin : nullptr;
    detail::logprob_rows_forward(a, z);
  }
  out.values.logprobs = logprobs.view({B, L});
  if (options.entropy) out.values.entropy = entropy.view({B, L});
  out.values.has_target = t.targets != kIgnoreLabel;
  return out;
}

TokenLogprobsGrads token_logprobs_backward(const at::Tensor& hidden, const at::Tensor& weight,
                                           const at::Tensor& targets, const at::Tensor& stats,
                                           const at::Tensor& grad_logprobs,
                                           const at::Tensor& grad_entropy,
                                           const TokenLogprobsOptions& options, bool want_hidden,
                                           bool want_weight) {
  check_options(hidden, weight, options);
  const int64_t B = hidden.size(0), L = hidden.size(1), H = hidden.size(2), V = weight.size(0);
  const int64_t rows = B * L;
  detail::require_defined(targets, "targets");
  detail::require_dtype(targets, at::kLong, "targets");
  if (targets.sizes() != at::IntArrayRef{B, L} || targets.device() != hidden.device())
    raise("targets", "must be [B, L] = [", B, ", ", L, "] on ", hidden.device(), ", got ",
          detail::shape_of(targets), " on ", targets.device());
  detail::require_defined(stats, "stats");
  detail::require_dtype(stats, at::kFloat, "stats");
  if (stats.sizes() != at::IntArrayRef{rows, 3} || stats.device() != hidden.device())
    raise("stats", "must be [B * L, 3] = [", rows, ", 3] on ", hidden.device(), ", got ",
          detail::shape_of(stats), " on ", stats.device());
  const at::NoGradGuard no_grad;
  const at::Tensor t = targets.contiguous().reshape({rows});
  const at::Tensor s = stats.contiguous();
  const at::Tensor g_lp = grad_logprobs.defined()
                              ? upstream_rows(grad_logprobs, targets, "grad_logprobs")
                              : at::Tensor();
  // Fault: the entropy's upstream lost on the way to the kernel (as a None would be).
  const at::Tensor g_ent = grad_entropy.defined() && !detail::fault("entropy_upstream_dropped")
                               ? upstream_rows(grad_entropy, targets, "grad_entropy")
                               : at::Tensor();
  TokenLogprobsGrads out;
  if (!want_hidden && !want_weight) return out;
  const detail::HeadGemms head(hidden.detach().reshape({rows, H}), weight.detach(),
                               options.logits_precision, options.chunk_rows,
                               detail::kLogprobCpuChunkBytes);
  const auto f32 = hidden.options().dtype(at::kFloat);
  at::Tensor grad_hidden = want_hidden ? at::empty({rows, H}, hidden.options()) : at::Tensor();
  // fp32 accumulator, written by the first chunk and added to by the rest (as the loss's).
  at::Tensor grad_weight = want_weight ? at::empty({V, H}, f32) : at::Tensor();
  for (int64_t begin = 0; begin < rows; begin += head.chunk()) {
    const at::Tensor z = head.logits(begin, std::min(head.chunk(), rows - begin));
    kernels::TokenLogprobsArgs a =
        detail::logprob_rows(z, t, s, begin, options.softcap, options.temperature);
    a.grad_logprobs = g_lp.defined() ? g_lp.data_ptr<float>() + begin : nullptr;
    a.grad_entropy = g_ent.defined() ? g_ent.data_ptr<float>() + begin : nullptr;
    a.grad = z.data_ptr<float>();
    detail::logprob_rows_backward(a, z);
    const at::Tensor g = head.gradient_operand(z);
    if (want_hidden) head.grad_hidden(g, grad_hidden.narrow(0, begin, z.size(0)));
    if (want_weight) head.accumulate_grad_weight(grad_weight, g, begin, begin == 0);
  }
  if (want_hidden) out.hidden = grad_hidden.view(hidden.sizes());
  if (want_weight) out.weight = grad_weight.to(weight.scalar_type());
  return out;
}

int64_t default_logprob_chunk_rows(int64_t vocab, int64_t rows, bool cuda) {
  return detail::default_chunk_rows(vocab, rows, cuda, detail::kLogprobCpuChunkBytes);
}

TokenLogprobs token_logprobs(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& labels, const at::Tensor& valid, const MeshPtr& mesh,
                             const TokenLogprobsOptions& options) {
  const auto outputs = TokenLogprobsFunction::apply(hidden, weight, labels, valid, mesh, options);
  return {outputs[0], options.entropy ? outputs[1] : at::Tensor(), outputs[2]};
}

}  // namespace cpkit
