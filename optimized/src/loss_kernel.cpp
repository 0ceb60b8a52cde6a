// The fused cross-entropy kernel on LibTorch tensors, and the loss and upstream scalings.
#include "loss_kernel.hpp"

#include <ATen/ATen.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cuda_glue.hpp"
#include "fault_injection.hpp"
#include "head_gemms.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/upstream_scale.hpp"

namespace cpkit::detail {

void cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets,
                        const at::Tensor& count, int64_t cp, double softcap, const at::Tensor& grad,
                        const at::Tensor& row_loss, const at::Tensor& scale) {
  kernels::CrossEntropyArgs args{};
  args.logits = logits.data_ptr<float>();
  args.targets = targets.data_ptr<int64_t>();
  args.rows = targets.numel();
  args.vocab = logits.size(-1);
  args.softcap = static_cast<float>(softcap);
  args.cp = static_cast<int>(cp);
  args.count = count.data_ptr<int64_t>();
  args.grad = grad.data_ptr<float>();
  args.row_loss = row_loss.data_ptr<float>();
  args.scale = scale.data_ptr<float>();
  args.vocab_major = logits.dim() == 2 && vocab_major(logits, "logits");
  if (args.vocab_major != (grad.dim() == 2 && vocab_major(grad, "grad")))
    raise("grad", "must be laid out as logits (vocab-major: ", args.vocab_major, ")");
  if (logits.is_cuda())
    launch_on(logits, [&](void* stream) { kernels::cross_entropy_cuda(args, stream); });
  else
    kernels::cross_entropy_cpu(args);
  if (fault("nan_without_targets"))  // CP / N without the N == 0 rule
    scale.copy_(static_cast<double>(cp) / count.to(at::kDouble));
}

at::Tensor scaled_loss(const at::Tensor& row_loss, const at::Tensor& scale) {
  return (row_loss.to(at::kDouble).sum() * scale.to(at::kDouble).squeeze(0)).to(at::kFloat);
}

at::Tensor times_upstream(const at::Tensor& grad, const at::Tensor& upstream) {
  return cpkit::leaves_gradient_as_is(upstream) ? grad : grad * upstream;
}

void scale_by_upstream_in_place(const at::Tensor& grad, const at::Tensor& upstream) {
  if (!upstream.is_cuda()) {  // a host scalar: reading it costs no synchronisation
    const float u = upstream.item<float>();
    if (!grad.is_cuda())
      kernels::scale_by_upstream_cpu(grad.data_ptr<float>(), grad.numel(), &u);
    else if (!kernels::leaves_gradient_as_is(u))
      grad.mul_(u);
    return;
  }
  const at::Tensor u = upstream.to(at::kFloat);  // a no-op for the fp32 loss's upstream
  launch_on(grad, [&](void* stream) {
    kernels::scale_by_upstream_cuda(grad.data_ptr<float>(), grad.numel(), u.data_ptr<float>(),
                                    stream);
  });
}

}  // namespace cpkit::detail
