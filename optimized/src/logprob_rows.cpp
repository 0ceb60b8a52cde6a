// The token_logprobs kernels over one chunk of logits (logprob_rows.hpp).
#include "logprob_rows.hpp"

#include "cuda_glue.hpp"
#include "head_gemms.hpp"

namespace cpkit::detail {

kernels::TokenLogprobsArgs logprob_rows(const at::Tensor& z, const at::Tensor& targets,
                                        const at::Tensor& stats, int64_t begin, double softcap,
                                        double temperature) {
  kernels::TokenLogprobsArgs a{};
  a.logits = z.data_ptr<float>();
  a.targets = targets.data_ptr<int64_t>() + begin;
  a.rows = z.size(0);
  a.vocab = z.size(1);
  a.softcap = static_cast<float>(softcap);
  a.inv_temperature = static_cast<float>(1.0 / temperature);
  a.stats = stats.data_ptr<float>() + 3 * begin;
  a.vocab_major = vocab_major(z, "logits");
  return a;
}

void logprob_rows_forward(const kernels::TokenLogprobsArgs& args, const at::Tensor& z) {
  if (!z.is_cuda()) return kernels::token_logprobs_forward_cpu(args);
  launch_on(z, [&](void* stream) { kernels::token_logprobs_forward_cuda(args, stream); });
}

void logprob_rows_backward(const kernels::TokenLogprobsArgs& args, const at::Tensor& z) {
  if (!z.is_cuda()) return kernels::token_logprobs_backward_cpu(args);
  launch_on(z, [&](void* stream) { kernels::token_logprobs_backward_cuda(args, stream); });
}

}  // namespace cpkit::detail
