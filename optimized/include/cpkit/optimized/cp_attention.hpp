// cp_attention: cpkit's own context-parallel attention (docs/spec.md section 4b). Each rank
// receives only the keys and values its queries need (the attention plan, derived from the
// shard with no communication), attends over its own and the received keys under the
// document-causal mask (sliding window, GQA, sinks, soft cap), and returns the key gradients
// of received keys to their owners in the backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

struct CpAttentionOptions {
  double scale = 0.0;    // 0: 1 / sqrt(D)
  double softcap = 0.0;  // > 0: scores c * tanh(s / c)
  at::Tensor sinks;      // optional [Hq] float32: a logit per query head in every denominator
};

struct CpAttentionOutput {
  at::Tensor out;  // [rows, L, Hq, D], q's dtype
  at::Tensor lse;  // [rows, Hq, L] float32; -inf where a query sees nothing (and no sink)
};

// q [rows, L, Hq, D], k and v [rows, L, Hkv, D] (Hq a multiple of Hkv; float32, bfloat16 or
// float16, one dtype; CPU or CUDA): this rank's shard in local order. `plan` is
// attention_plan(sharder, microbatch, mesh's rank, window) of the same shard. Differentiable in q,
// k, v and sinks (d sinks is this rank's term). Raises naming the argument on bad input; ranks
// whose shapes, options or plans disagree raise together.
CpAttentionOutput cp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::shared_ptr<const AttentionPlan>& plan,
                               const MeshPtr& mesh, const CpAttentionOptions& options = {});

// The same as two calls without autograd (the forward and backward halves).
struct CpAttentionForward {
  CpAttentionOutput values;
  at::Tensor received;  // [received keys, 2, Hkv, D] float32: the keys and values that came in
};
CpAttentionForward cp_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const AttentionPlan& plan,
                                        const MeshPtr& mesh, const CpAttentionOptions& options);

struct CpAttentionGrads {
  at::Tensor q, k, v;  // like the inputs, on their owners
  at::Tensor sinks;    // [Hq] float32 when sinks were given
};
CpAttentionGrads cp_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const CpAttentionForward& forward,
                                       const at::Tensor& grad_out, const AttentionPlan& plan,
                                       const MeshPtr& mesh, const CpAttentionOptions& options);

// What this process's cp_attention calls moved and waited for since the last reset: bytes in
// and out over both passes, and the seconds each pass waited for its exchange after the
// stage it overlaps (communication the overlap did not hide): the forward for the received
// keys after attending its own, the backward for its keys' returned gradients after its own
// keys' gradients.
struct CpAttentionStats {
  std::int64_t calls = 0, bytes_received = 0, bytes_sent = 0;
  double forward_exposed_seconds = 0, backward_exposed_seconds = 0;
};
CpAttentionStats cp_attention_stats();
void reset_cp_attention_stats();

// Bytes the forward moves into this rank (the backward moves as many out): received keys
// and values at `itemsize` bytes per element of [Hkv, D].
std::int64_t cp_attention_received_bytes(const AttentionPlan& plan, std::int64_t hkv,
                                         std::int64_t head_dim, std::int64_t itemsize);

}  // namespace cpkit
