// cp_attention's kernels on raw pointers (plain C++ header): one rank's queries against the
// key slots the attention plan lists for each of them (attention_plan.hpp), online softmax
// with an optional per-head sink and soft cap; the backward recomputes each probability from
// the saved log-sum-exp (no [L, S] matrix, no mask).
#pragma once

#include <cstdint>

namespace cpkit::kernels {

struct AttentionArgs {
  const float* q;                 // [queries, hq, d]
  const float* k;                 // [keys, hkv, d]: the key slots
  const float* v;                 // [keys, hkv, d]
  const std::int64_t* key_slots;  // a KeyIndex's slots (attention_plan.hpp)
  const std::int64_t* key_begin;  // [queries]
  const std::int64_t* key_end;    // [queries]
  std::int64_t slot_offset;       // slot s is row s - slot_offset of k and v
  const float* sinks;             // [hq] or null
  std::int64_t queries, keys, hq, hkv, d;
  float scale;    // > 0
  float softcap;  // 0: none
  float* out;     // [queries, hq, d]
  float* lse;     // [queries, hq]; -inf where nothing (not even a sink) is seen
  // Backward only.
  const float* d_out;  // [queries, hq, d]
  float* dq;           // [queries, hq, d], written
  float* dk;           // [keys, hkv, d], written
  float* dv;           // [keys, hkv, d], written
  float* dsinks;       // [hq], written when sinks is given
};

// The CUDA kernels keep a query's head in registers, D / 32 values per lane.
constexpr std::int64_t kMaxCudaHeadDim = 256;

// Writes out and lse.
void attention_forward_cpu(const AttentionArgs& args);
// Reads q, k, v, out, lse, d_out; writes dq, dk, dv (and dsinks).
void attention_backward_cpu(const AttentionArgs& args);

// The same on device pointers (d <= kMaxCudaHeadDim), enqueued on `stream` (a cudaStream_t).
// CUDA builds only. The backward's dk, dv and dsinks are sums of atomic adds: not bitwise
// deterministic from run to run.
void attention_forward_cuda(const AttentionArgs& args, void* stream);
void attention_backward_cuda(const AttentionArgs& args, void* stream);

}  // namespace cpkit::kernels
