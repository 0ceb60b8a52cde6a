// policy_loss as torch.ops.cpkit.policy_loss: the fused forward returns the loss, the
// per-position values and the gradients the backward scales (cpkit/optimized/policy_loss.hpp).
// Autograd, fake and autocast kernels are registered from Python (cpkit/_ops.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpkit/optimized/policy_loss.hpp"
#include "layout_codec.hpp"
#include "mesh_registry.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// The loss, logprobs, ratio, clipped, kl, entropy, then d hidden and d weight (empty [0]
// when not asked for).
using PolicyOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                 at::Tensor, at::Tensor, at::Tensor>;

PolicyOutputs policy_loss_op(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
    const at::Tensor& valid, const at::Tensor& advantages, const at::Tensor& old_logprobs,
    const std::optional<at::Tensor>& ref_logprobs,
    const std::optional<at::Tensor>& sampler_logprobs,
    const std::optional<at::Tensor>& sequence_ids, const std::string& group_name,
    const std::string& dp_group_name, const std::string& kind, double eps_low, double eps_high,
    double dual_clip, const std::string& kl, double kl_coef, double tis_cap, double entropy_coef,
    const std::string& aggregation, double divisor, double softcap, double temperature,
    const std::string& logits_precision, int64_t chunk_rows, bool grad_hidden, bool grad_weight,
    const std::optional<at::Tensor>& layout, bool entropy) {
  return checked([&] {
    PolicyLossOptions o;
    o.kind = parse_policy_kind(kind);
    o.eps_low = eps_low;
    o.eps_high = eps_high;
    o.dual_clip = dual_clip;
    o.kl = parse_kl_estimator(kl);
    o.kl_coef = kl_coef;
    o.tis_cap = tis_cap;
    o.entropy_coef = entropy_coef;
    o.entropy = entropy;
    o.aggregation = parse_policy_aggregation(aggregation);
    o.divisor = divisor;
    o.softcap = softcap;
    o.temperature = temperature;
    o.logits_precision = parse_logits_precision(logits_precision);
    o.chunk_rows = chunk_rows;
    o.layout = layout.has_value() ? plan_from_tensor(*layout, "layout") : nullptr;
    o.dp_mesh = mesh_for(dp_group_name, hidden.device());
    const PolicyLossInputs inputs{advantages, old_logprobs, ref_logprobs.value_or(at::Tensor()),
                                  sampler_logprobs.value_or(at::Tensor()),
                                  sequence_ids.value_or(at::Tensor())};
    const PolicyLossWithGrad r =
        policy_loss_with_grad(hidden, weight, labels, valid, mesh_for(group_name, hidden.device()),
                              inputs, o, {.hidden = grad_hidden, .weight = grad_weight});
    const PolicyLoss& v = r.values;
    return PolicyOutputs{v.loss,
                         v.logprobs,
                         v.ratio,
                         v.clipped,
                         v.kl,
                         v.entropy,
                         r.grad_hidden.defined() ? r.grad_hidden : hidden.new_empty({0}),
                         r.grad_weight.defined() ? r.grad_weight : weight.new_empty({0})};
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  m.def(
      "policy_loss(Tensor hidden, Tensor weight, Tensor labels, Tensor valid, Tensor advantages, "
      "Tensor old_logprobs, Tensor? ref_logprobs, Tensor? sampler_logprobs, "
      "Tensor? sequence_ids, str group_name, str dp_group_name, str kind, float eps_low, "
      "float eps_high, float dual_clip, str kl, float kl_coef, float tis_cap, "
      "float entropy_coef, str aggregation, float divisor, float softcap, float temperature, "
      "str logits_precision, int chunk_rows, bool grad_hidden, bool grad_weight, "
      "Tensor? layout=None, bool entropy=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
      "Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cpkit, CPU, m) { m.impl("policy_loss", &policy_loss_op); }

TORCH_LIBRARY_IMPL(cpkit, CUDA, m) { m.impl("policy_loss", &policy_loss_op); }

}  // namespace cpkit::python
