// The losses and the LM head as torch.ops.cpkit.*: shifted_cp_loss (the loss and its fused
// gradient), shifted_cp_linear_loss and token_logprobs with its backward half
// (cpkit/optimized/loss.hpp, linear_loss.hpp, token_logprobs.hpp), and the rules a Python
// backward shares with the C++ API's. Autograd and fake kernels: cpkit/_ops.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "layout_codec.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// The plan a loss was cut with: none (contiguous) or the shard's "layout" tensor.
std::shared_ptr<const LayoutPlan> plan_or_none(const std::optional<at::Tensor>& layout) {
  return layout.has_value() ? plan_from_tensor(*layout, "layout") : nullptr;
}

std::tuple<at::Tensor, at::Tensor> shifted_cp_loss_op(const at::Tensor& logits,
                                                      const at::Tensor& labels,
                                                      const at::Tensor& valid,
                                                      const std::string& group_name, double softcap,
                                                      const std::optional<at::Tensor>& layout) {
  return checked([&] {
    LossWithGrad out =
        shifted_cp_loss_with_grad(logits, labels, valid, mesh_for(group_name, logits.device()),
                                  {.softcap = softcap, .layout = plan_or_none(layout)});
    return std::make_tuple(out.loss, out.grad_logits);
  });
}

void scale_loss_gradient_op(const at::Tensor& grad_logits, const at::Tensor& upstream) {
  checked([&] { scale_loss_gradient_(grad_logits, upstream); });
}

// A gradient (or output) not asked for comes back as an empty [0] tensor (an op returns no
// None).
at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : like.new_empty({0});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> shifted_cp_linear_loss_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
    const at::Tensor& valid, const std::string& group_name, double softcap, int64_t chunk_rows,
    bool grad_hidden, bool grad_weight, const std::optional<at::Tensor>& layout,
    const std::string& logits_precision) {
  return checked([&] {
    LinearLossWithGrad out = shifted_cp_linear_loss_with_grad(
        hidden, weight, labels, valid, mesh_for(group_name, hidden.device()),
        {.softcap = softcap,
         .chunk_rows = chunk_rows,
         .logits_precision = parse_logits_precision(logits_precision),
         .layout = plan_or_none(layout)},
        {.hidden = grad_hidden, .weight = grad_weight});
    return std::make_tuple(out.loss, or_empty(out.grad_hidden, hidden),
                           or_empty(out.grad_weight, weight));
  });
}

TokenLogprobsOptions logprob_options(double softcap, double temperature, bool entropy,
                                     const std::string& logits_precision, int64_t chunk_rows,
                                     const std::optional<at::Tensor>& layout) {
  return {.softcap = softcap,
          .temperature = temperature,
          .entropy = entropy,
          .logits_precision = parse_logits_precision(logits_precision),
          .chunk_rows = chunk_rows,
          .layout = plan_or_none(layout)};
}

// The values, then what the backward needs (targets, per-position statistics); an entropy
// not asked for is an empty [0] tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> token_logprobs_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
    const at::Tensor& valid, const std::string& group_name, double softcap, double temperature,
    bool entropy, const std::string& logits_precision, int64_t chunk_rows,
    const std::optional<at::Tensor>& layout) {
  return checked([&] {
    TokenLogprobsForward out = token_logprobs_forward(
        hidden, weight, labels, valid, mesh_for(group_name, hidden.device()),
        logprob_options(softcap, temperature, entropy, logits_precision, chunk_rows, layout));
    return std::make_tuple(out.values.logprobs, or_empty(out.values.entropy, hidden),
                           out.values.has_target, out.targets, out.stats);
  });
}

std::tuple<at::Tensor, at::Tensor> token_logprobs_backward_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
    const at::Tensor& stats, const std::optional<at::Tensor>& grad_logprobs,
    const std::optional<at::Tensor>& grad_entropy, double softcap, double temperature,
    const std::string& logits_precision, int64_t chunk_rows, bool grad_hidden, bool grad_weight) {
  return checked([&] {
    const TokenLogprobsGrads g = token_logprobs_backward(
        hidden, weight, targets, stats, grad_logprobs.value_or(at::Tensor()),
        grad_entropy.value_or(at::Tensor()),
        logprob_options(softcap, temperature, false, logits_precision, chunk_rows, std::nullopt),
        grad_hidden, grad_weight);
    return std::make_tuple(or_empty(g.hidden, hidden), or_empty(g.weight, weight));
  });
}

bool leaves_gradient_as_is_op(const at::Tensor& upstream) {
  return checked([&] { return leaves_gradient_as_is(upstream); });
}

void check_backward_once_op(bool done) {
  checked([&] { check_backward_once(done); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  m.def(
      "shifted_cp_loss(Tensor logits, Tensor labels, Tensor valid, str group_name, float softcap, "
      "Tensor? layout=None) -> (Tensor, Tensor)");
  // The loss's backward: scales the saved gradient in place (nothing when the upstream is 1).
  m.def("scale_loss_gradient_(Tensor(a!) grad_logits, Tensor upstream) -> ()");
  m.def(
      "shifted_cp_linear_loss(Tensor hidden, Tensor weight, Tensor labels, Tensor valid, "
      "str group_name, float softcap, int chunk_rows, bool grad_hidden, bool grad_weight, "
      "Tensor? layout=None, str logits_precision=\"input\") -> (Tensor, Tensor, Tensor)");
  // Returns (logprobs, entropy, has_target, targets, stats); the last two feed the backward.
  m.def(
      "token_logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor valid, str group_name, "
      "float softcap, float temperature, bool entropy, str logits_precision, int chunk_rows, "
      "Tensor? layout=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "token_logprobs_backward(Tensor hidden, Tensor weight, Tensor targets, Tensor stats, "
      "Tensor? grad_logprobs, Tensor? grad_entropy, float softcap, float temperature, "
      "str logits_precision, int chunk_rows, bool grad_hidden, bool grad_weight) "
      "-> (Tensor, Tensor)");
  // The rules a Python backward shares with the C++ API's (loss.hpp); eager only.
  m.def("leaves_gradient_as_is(Tensor upstream) -> bool", &leaves_gradient_as_is_op);
  m.def("check_backward_once(bool done) -> ()", &check_backward_once_op);
}

#define CPKIT_REGISTER_KERNELS(KEY)                                 \
  TORCH_LIBRARY_IMPL(cpkit, KEY, m) {                               \
    m.impl("shifted_cp_loss", &shifted_cp_loss_op);                 \
    m.impl("scale_loss_gradient_", &scale_loss_gradient_op);        \
    m.impl("shifted_cp_linear_loss", &shifted_cp_linear_loss_op);   \
    m.impl("token_logprobs", &token_logprobs_op);                   \
    m.impl("token_logprobs_backward", &token_logprobs_backward_op); \
  }
CPKIT_REGISTER_KERNELS(CPU)
CPKIT_REGISTER_KERNELS(CUDA)

}  // namespace cpkit::python
