// The token_logprobs kernels over one chunk of logits (internal header): what token_logprobs
// and policy_loss share between a chunk's logits GEMM and its gradient GEMMs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/token_logprobs_launch.hpp"

namespace cpkit::detail {

// The kernels' arguments for rows [begin, begin + z.size(0)) of a call: logits z (row- or
// vocab-major), every row's targets [rows] and saved statistics [rows, 3].
kernels::TokenLogprobsArgs logprob_rows(const at::Tensor& z, const at::Tensor& targets,
                                        const at::Tensor& stats, int64_t begin, double softcap,
                                        double temperature);

// The forward (values and statistics) and the backward (the gradient, in place when
// args.grad is z's storage) on z's device.
void logprob_rows_forward(const kernels::TokenLogprobsArgs& args, const at::Tensor& z);
void logprob_rows_backward(const kernels::TokenLogprobsArgs& args, const at::Tensor& z);

}  // namespace cpkit::detail
