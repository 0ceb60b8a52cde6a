// shifted_cp_linear_loss: targets and count once, then per chunk of token rows: logits =
// hidden @ weight^T into one reused fp32 buffer, the fused kernel turns them into their
// gradient in place, and two matmuls fold that gradient into d hidden and d weight.
#include "cpkit/optimized/linear_loss.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "head_gemms.hpp"
#include "loss_kernel.hpp"
#include "loss_targets.hpp"

namespace cpkit {

namespace {

LinearLossWithGrad fused_linear_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                     const detail::Targets& t, int64_t cp,
                                     const LinearLossOptions& options, LinearLossGrads want) {
  const int64_t H = hidden.size(2), V = weight.size(0), rows = t.targets.numel();
  const detail::HeadGemms head(hidden.reshape({rows, H}), weight, options.logits_precision,
                               options.chunk_rows, detail::kLossCpuChunkBytes);
  const at::Tensor targets = t.targets.reshape({rows});
  const auto f32 = hidden.options().dtype(at::kFloat);
  at::Tensor row_loss = at::empty({rows}, f32);
  at::Tensor scale = at::empty({1}, f32);
  at::Tensor grad_hidden = want.hidden ? at::empty({rows, H}, hidden.options()) : at::Tensor();
  // fp32 accumulator whatever the weight's dtype: bf16 would round once per chunk. The first
  // chunk writes it (no zero fill, one pass less over [V, H]); later chunks add to it.
  at::Tensor grad_weight = want.weight ? at::empty({V, H}, f32) : at::Tensor();
  for (int64_t begin = 0; begin < rows; begin += head.chunk()) {
    const int64_t n = std::min(head.chunk(), rows - begin);
    const at::Tensor z = head.logits(begin, n);
    detail::cross_entropy_rows(z, targets.narrow(0, begin, n), t.count, cp, options.softcap, z,
                               row_loss.narrow(0, begin, n), scale);
    // z now holds d loss / d logits of these rows.
    const at::Tensor g = head.gradient_operand(z);
    if (want.hidden) head.grad_hidden(g, grad_hidden.narrow(0, begin, n));
    if (want.weight) head.accumulate_grad_weight(grad_weight, g, begin, begin == 0);
  }
  LinearLossWithGrad out;
  out.loss = detail::scaled_loss(row_loss, scale);
  if (want.hidden) out.grad_hidden = grad_hidden.view(hidden.sizes());
  if (want.weight) out.grad_weight = grad_weight.to(weight.scalar_type());
  return out;
}

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& count, int64_t cp, const LinearLossOptions& options,
                            LinearLossGrads want) {
    LinearLossWithGrad out = fused_linear_loss(hidden, weight, {targets, count}, cp, options, want);
    ctx->save_for_backward({out.grad_hidden, out.grad_weight});
    return out.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto scaled = [&](const at::Tensor& g) {
      return g.defined() ? detail::times_upstream(g, grads[0]) : at::Tensor();
    };
    return {scaled(saved[0]), scaled(saved[1]), at::Tensor(), at::Tensor(),
            at::Tensor(),     at::Tensor(),     at::Tensor()};
  }
};

detail::Targets prepare_linear(const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& labels, const at::Tensor& valid,
                               const MeshPtr& mesh, const LinearLossOptions& options) {
  detail::check_head_inputs(hidden, weight, options.softcap, options.chunk_rows);
  return detail::prepare_targets(labels, valid, hidden, "hidden", weight.size(0), "weight", mesh,
                                 options.layout.get());
}

}  // namespace

int64_t default_linear_loss_chunk_rows(int64_t vocab, int64_t rows, bool cuda) {
  return detail::default_chunk_rows(vocab, rows, cuda, detail::kLossCpuChunkBytes);
}

at::Tensor shifted_cp_linear_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                  const at::Tensor& labels, const at::Tensor& valid,
                                  const MeshPtr& mesh, const LinearLossOptions& options) {
  const detail::Targets t = prepare_linear(hidden, weight, labels, valid, mesh, options);
  // Only the gradients autograd will ask for: a frozen head costs no d weight matmul.
  const bool grad_on = at::GradMode::is_enabled();
  return LinearCrossEntropy::apply(hidden, weight, t.targets, t.count, int64_t{cp_size(mesh)},
                                   options,
                                   LinearLossGrads{.hidden = grad_on && hidden.requires_grad(),
                                                   .weight = grad_on && weight.requires_grad()});
}

LinearLossWithGrad shifted_cp_linear_loss_with_grad(const at::Tensor& hidden,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& labels,
                                                    const at::Tensor& valid, const MeshPtr& mesh,
                                                    const LinearLossOptions& options,
                                                    LinearLossGrads grads) {
  const detail::Targets t = prepare_linear(hidden, weight, labels, valid, mesh, options);
  const at::NoGradGuard no_grad;
  return fused_linear_loss(hidden.detach(), weight.detach(), t, cp_size(mesh), options, grads);
}

}  // namespace cpkit
