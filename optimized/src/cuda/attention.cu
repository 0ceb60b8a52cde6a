// cp_attention's CUDA kernels (kernels/attention_launch.hpp): one warp per (query, head), the
// query's head in registers (D / 32 values per lane), one pass over the query's listed key
// slots with the online softmax of kernels/attention_math.hpp. The backward recomputes each
// probability from the saved log-sum-exp and adds into dk, dv (and dsinks) atomically, since
// a key slot is read by many queries' warps.
#include <cuda_runtime.h>

#include "cuda/launch_check.hpp"
#include "kernels/attention_launch.hpp"
#include "kernels/attention_math.hpp"

namespace cpkit::kernels {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kLanes = 32;
constexpr int kPerLane = static_cast<int>(kMaxCudaHeadDim / kLanes);

__device__ float warp_sum(float x) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// This lane's values of a head row: elements lane, lane + 32, ... below d (0 past d).
__device__ void load_lane(const float* row, std::int64_t d, int lane, float (&out)[kPerLane]) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = lane + c * kLanes;
    out[c] = e < d ? row[e] : 0.0f;
  }
}

__device__ float lane_dot(const float (&a)[kPerLane], const float* row, std::int64_t d, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = lane + c * kLanes;
    if (e < d) s += a[c] * row[e];
  }
  return warp_sum(s);
}

struct Work {
  std::int64_t t, query, head, key_head;
  int lane;
};

// The warp's (query, head) pair; false for the last block's spare warps (whole warps).
__device__ bool work_of(const AttentionArgs& a, Work& w) {
  w.t = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kLanes;
  w.lane = static_cast<int>(threadIdx.x % kLanes);
  if (w.t >= a.queries * a.hq) return false;
  w.query = w.t / a.hq;
  w.head = w.t % a.hq;
  w.key_head = w.head / (a.hq / a.hkv);
  return true;
}

__device__ std::int64_t key_row(const AttentionArgs& a, std::int64_t x, std::int64_t key_head) {
  return ((a.key_slots[x] - a.slot_offset) * a.hkv + key_head) * a.d;
}

__global__ void __launch_bounds__(kWarpsPerBlock* kLanes) forward_kernel(AttentionArgs a) {
  Work w;
  if (!work_of(a, w)) return;
  float q[kPerLane], acc[kPerLane] = {};
  load_lane(a.q + w.t * a.d, a.d, w.lane, q);
  OnlineRow row =
      a.sinks != nullptr ? OnlineRow{a.sinks[w.head], 1.0f} : OnlineRow{-INFINITY, 0.0f};
  for (std::int64_t x = a.key_begin[w.query]; x < a.key_end[w.query]; ++x) {
    const std::int64_t at = key_row(a, x, w.key_head);
    float p = 0.0f;
    const float shrink = online_step(
        row, attention_score(lane_dot(q, a.k + at, a.d, w.lane), a.scale, a.softcap).value, p);
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const std::int64_t e = w.lane + c * kLanes;
      acc[c] = acc[c] * shrink + (e < a.d ? p * a.v[at + e] : 0.0f);
    }
  }
  float* out = a.out + w.t * a.d;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = w.lane + c * kLanes;
    if (e < a.d) out[e] = row.sum == 0.0f ? 0.0f : acc[c] / row.sum;
  }
  if (w.lane == 0) a.lse[w.t] = row.sum == 0.0f ? -INFINITY : row.max + logf(row.sum);
}

__global__ void __launch_bounds__(kWarpsPerBlock* kLanes) backward_kernel(AttentionArgs a) {
  Work w;
  if (!work_of(a, w)) return;
  float q[kPerLane], d_out[kPerLane], out[kPerLane], dq[kPerLane] = {};
  const float lse = a.lse[w.t];
  if (lse != -INFINITY) {  // nothing seen: zero gradients
    load_lane(a.q + w.t * a.d, a.d, w.lane, q);
    load_lane(a.d_out + w.t * a.d, a.d, w.lane, d_out);
    load_lane(a.out + w.t * a.d, a.d, w.lane, out);
    float delta = 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) delta += d_out[c] * out[c];
    delta = warp_sum(delta);
    if (a.sinks != nullptr && w.lane == 0)
      atomicAdd(a.dsinks + w.head, -expf(a.sinks[w.head] - lse) * delta);
    for (std::int64_t x = a.key_begin[w.query]; x < a.key_end[w.query]; ++x) {
      const std::int64_t at = key_row(a, x, w.key_head);
      const AttentionScore s =
          attention_score(lane_dot(q, a.k + at, a.d, w.lane), a.scale, a.softcap);
      const float p = expf(s.value - lse);
      const float ds = p * (lane_dot(d_out, a.v + at, a.d, w.lane) - delta) * s.slope * a.scale;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const std::int64_t e = w.lane + c * kLanes;
        if (e >= a.d) continue;
        dq[c] += ds * a.k[at + e];
        atomicAdd(a.dk + at + e, ds * q[c]);
        atomicAdd(a.dv + at + e, p * d_out[c]);
      }
    }
  }
  float* dq_row = a.dq + w.t * a.d;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = w.lane + c * kLanes;
    if (e < a.d) dq_row[e] = dq[c];
  }
}

unsigned blocks_for(const AttentionArgs& a) {
  return static_cast<unsigned>((a.queries * a.hq + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

void require_head_dim(const AttentionArgs& a, const char* kernel) {
  if (a.d > kMaxCudaHeadDim || a.d < 1)
    throw std::runtime_error(std::string("cpkit: ") + kernel + " takes head sizes 1.." +
                             std::to_string(kMaxCudaHeadDim) + ", got " + std::to_string(a.d));
}

}  // namespace

void attention_forward_cuda(const AttentionArgs& a, void* stream) {
  require_head_dim(a, "attention_forward_cuda");
  if (a.queries * a.hq == 0) return;
  checked_launch("cp_attention forward_kernel", [&] {
    forward_kernel<<<blocks_for(a), kWarpsPerBlock * kLanes, 0,
                     static_cast<cudaStream_t>(stream)>>>(a);
  });
}

void attention_backward_cuda(const AttentionArgs& a, void* stream) {
  require_head_dim(a, "attention_backward_cuda");
  const auto s = static_cast<cudaStream_t>(stream);
  const auto bytes = static_cast<std::size_t>(a.keys * a.hkv * a.d) * sizeof(float);
  check_cuda(cudaMemsetAsync(a.dk, 0, bytes, s), "zeroing cp_attention's dk");
  check_cuda(cudaMemsetAsync(a.dv, 0, bytes, s), "zeroing cp_attention's dv");
  if (a.dsinks != nullptr)
    check_cuda(cudaMemsetAsync(a.dsinks, 0, static_cast<std::size_t>(a.hq) * sizeof(float), s),
               "zeroing cp_attention's dsinks");
  if (a.queries * a.hq == 0) return;
  checked_launch("cp_attention backward_kernel",
                 [&] { backward_kernel<<<blocks_for(a), kWarpsPerBlock * kLanes, 0, s>>>(a); });
}

}  // namespace cpkit::kernels
