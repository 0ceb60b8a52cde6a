// CUDA kernels of the fused shifted cross-entropy (in place when grad == logits):
// - two-pass (the default; any architecture, any V): one block per row, an online softmax
//   over float4 loads of the row's aligned middle, a block-wide merge, one more pass for the
//   gradient.
// - cluster (sm_90+, on request; kernels/cluster_plan.hpp): a row split across a thread-block
//   cluster, each block holding its part in shared memory; one HBM read and one
//   (evict-first) write per logit, but slower than two-pass as measured so far.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "cuda/launch_check.hpp"
#include "kernels/cluster_plan.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"
#include "kernels/targets.hpp"

namespace cpkit::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ OnlineSoftmax warp_merge(OnlineSoftmax s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    OnlineSoftmax other{__shfl_down_sync(0xffffffffu, s.max, offset),
                        __shfl_down_sync(0xffffffffu, s.sum, offset)};
    s = online_merge(s, other);
  }
  return s;
}

// The block's statistics, merged over its warps; every thread gets them.
__device__ OnlineSoftmax block_merge(OnlineSoftmax s) {
  __shared__ float maxes[kWarps], sums[kWarps];
  __shared__ OnlineSoftmax merged;
  s = warp_merge(s);
  if (threadIdx.x % 32 == 0) {
    maxes[threadIdx.x / 32] = s.max;
    sums[threadIdx.x / 32] = s.sum;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    OnlineSoftmax w = threadIdx.x < kWarps ? OnlineSoftmax{maxes[threadIdx.x], sums[threadIdx.x]}
                                           : online_empty();
    w = warp_merge(w);
    if (threadIdx.x == 0) merged = w;
  }
  __syncthreads();
  return merged;
}

__global__ void __launch_bounds__(kThreads) two_pass_kernel(CrossEntropyArgs a) {
  const std::int64_t row = blockIdx.x;
  const float* z = a.logits + row * a.vocab;
  float* g = a.grad + row * a.vocab;
  const std::int64_t target = a.targets[row];
  if (row == 0 && threadIdx.x == 0) *a.scale = loss_scale(a.cp, *a.count);
  if (!reads_target(target, a.vocab)) {
    const float value = without_target(target);
    for (std::int64_t i = threadIdx.x; i < a.vocab; i += kThreads) g[i] = value;
    if (threadIdx.x == 0) a.row_loss[row] = value;
    return;
  }
  // 16-byte loads over the aligned middle of the row; the gradient is written the same way
  // when its row has the same alignment (always for in-place calls and torch's allocations).
  const VectorSpan span = vector_span(reinterpret_cast<std::uintptr_t>(z), a.vocab);
  const bool same_alignment =
      (reinterpret_cast<std::uintptr_t>(g) - reinterpret_cast<std::uintptr_t>(z)) % 16 == 0;
  const std::int64_t tail_begin = span.head + 4 * span.quads;
  const float4* z4 = reinterpret_cast<const float4*>(z + span.head);
  // Read before the gradient pass: g may be z itself (an in-place call).
  const float target_z = threadIdx.x == 0 ? z[target] : 0.0f;
  OnlineSoftmax s = online_empty();
  for (std::int64_t i = threadIdx.x; i < span.quads; i += kThreads) {
    const float4 v = z4[i];
    online_add4(s, capped(v.x, a.softcap), capped(v.y, a.softcap), capped(v.z, a.softcap),
                capped(v.w, a.softcap));
  }
  for (std::int64_t i = threadIdx.x; i < span.head + span.tail; i += kThreads)
    online_add(s, capped(z[i < span.head ? i : tail_begin + i - span.head], a.softcap));
  const OnlineSoftmax stats = block_merge(s);
  const float row_max = stats.max, ls = log_sum(stats);
  const float scale = loss_scale(a.cp, *a.count);
  auto grad_at = [&](float v, std::int64_t k) {
    return cross_entropy_grad(v, k == target, row_max, ls, a.softcap, scale);
  };
  if (same_alignment) {
    float4* g4 = reinterpret_cast<float4*>(g + span.head);
    for (std::int64_t i = threadIdx.x; i < span.quads; i += kThreads) {
      const float4 v = z4[i];
      const std::int64_t k = span.head + 4 * i;
      g4[i] = make_float4(grad_at(v.x, k), grad_at(v.y, k + 1), grad_at(v.z, k + 2),
                          grad_at(v.w, k + 3));
    }
    for (std::int64_t i = threadIdx.x; i < span.head + span.tail; i += kThreads) {
      const std::int64_t k = i < span.head ? i : tail_begin + i - span.head;
      g[k] = grad_at(z[k], k);
    }
  } else {
    for (std::int64_t k = threadIdx.x; k < a.vocab; k += kThreads) g[k] = grad_at(z[k], k);
  }
  if (threadIdx.x == 0) a.row_loss[row] = cross_entropy_value(capped(target_z, a.softcap), stats);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CPKIT_CLUSTER_KERNEL 1
#endif

// Two blocks per SM (at most 64 registers a thread, 112 KB of shared memory each) keep enough
// loads in flight to saturate HBM.
// Block `part` of a cluster of `plan.blocks` handles row blockIdx.x / plan.blocks: the
// float4s quads_of_block(part) of the aligned middle, plus the head scalars (part 0) and the
// tail scalars (the last part).
__global__ void __launch_bounds__(kThreads, 2)
    cluster_kernel(CrossEntropyArgs a, ClusterPlan plan) {
#ifdef CPKIT_CLUSTER_KERNEL
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int part = static_cast<int>(cluster.block_rank());
  const bool first = part == 0, last = part == plan.blocks - 1;
  const std::int64_t row = blockIdx.x / plan.blocks;
  const float* z = a.logits + row * a.vocab;
  float* g = a.grad + row * a.vocab;
  const std::int64_t target = a.targets[row];
  const VectorSpan span = vector_span(reinterpret_cast<std::uintptr_t>(z), a.vocab);
  const QuadRange mine = quads_of_block(plan, part, span.quads);
  const std::int64_t tail_begin = span.head + 4 * span.quads;
  // This thread's edge scalar: a head one in part 0, a tail one in the last part.
  const auto t = static_cast<std::int64_t>(threadIdx.x);
  const std::int64_t head_k = first && t < span.head ? t : -1;
  const std::int64_t tail_k = last && t < span.tail ? tail_begin + t : -1;
  // Quad i of the gradient: one evict-first 16-byte store (the gradient is not read again
  // here) when its row shares the logits' alignment, else four scalar stores.
  float4* g4 = reinterpret_cast<float4*>(g + span.head);
  const bool aligned = reinterpret_cast<std::uintptr_t>(g4) % 16 == 0;
  auto store = [&](std::int64_t i, float4 d) {
    if (aligned) {
      __stcs(g4 + i, d);
    } else {
      const std::int64_t k = span.head + 4 * i;
      g[k] = d.x;
      g[k + 1] = d.y;
      g[k + 2] = d.z;
      g[k + 3] = d.w;
    }
  };
  if (first && threadIdx.x == 0 && row == 0) *a.scale = loss_scale(a.cp, *a.count);
  if (!reads_target(target, a.vocab)) {
    const float value = without_target(target);
    for (std::int64_t i = mine.begin + threadIdx.x; i < mine.end; i += kThreads)
      store(i, make_float4(value, value, value, value));
    if (head_k >= 0) g[head_k] = value;
    if (tail_k >= 0) g[tail_k] = value;
    if (first && threadIdx.x == 0) a.row_loss[row] = value;
    return;  // every block of the cluster returns here: no cluster barrier is pending
  }
  extern __shared__ float4 part_of_row[];
  const float4* z4 = reinterpret_cast<const float4*>(z + span.head);
  // Read before any block writes a gradient (after the first cluster barrier): g may be z.
  const float target_z = first && threadIdx.x == 0 ? z[target] : 0.0f;
  const float head_z = head_k >= 0 ? z[head_k] : 0.0f;
  const float tail_z = tail_k >= 0 ? z[tail_k] : 0.0f;
  OnlineSoftmax s = online_empty();
  if (head_k >= 0) online_add(s, capped(head_z, a.softcap));
  if (tail_k >= 0) online_add(s, capped(tail_z, a.softcap));
    // The one HBM read of this part: streaming loads (evict-first), four in flight per thread.
#pragma unroll 4
  for (std::int64_t i = mine.begin + threadIdx.x; i < mine.end; i += kThreads) {
    const float4 v = __ldcs(z4 + i);
    part_of_row[i - mine.begin] = v;
    online_add4(s, capped(v.x, a.softcap), capped(v.y, a.softcap), capped(v.z, a.softcap),
                capped(v.w, a.softcap));
  }
  __shared__ OnlineSoftmax part_stats;
  const OnlineSoftmax merged = block_merge(s);
  if (threadIdx.x == 0) part_stats = merged;
  cluster.sync();  // every part's statistics are visible cluster-wide
  // The same merge order in every block: all parts use the same row statistics.
  __shared__ OnlineSoftmax row_stats;
  if (threadIdx.x == 0) {
    OnlineSoftmax r = online_empty();
    for (int p = 0; p < plan.blocks; ++p)
      r = online_merge(r, *cluster.map_shared_rank(&part_stats, p));
    row_stats = r;
  }
  cluster.sync();  // no block leaves while a peer may still read its part_stats
  const OnlineSoftmax stats = row_stats;
  const float row_max = stats.max, ls = log_sum(stats);
  const float scale = loss_scale(a.cp, *a.count);
  auto grad_at = [&](float v, std::int64_t k) {
    return cross_entropy_grad(v, k == target, row_max, ls, a.softcap, scale);
  };
  for (std::int64_t i = mine.begin + threadIdx.x; i < mine.end; i += kThreads) {
    const float4 v = part_of_row[i - mine.begin];
    const std::int64_t k = span.head + 4 * i;
    store(i, make_float4(grad_at(v.x, k), grad_at(v.y, k + 1), grad_at(v.z, k + 2),
                         grad_at(v.w, k + 3)));
  }
  if (head_k >= 0) g[head_k] = grad_at(head_z, head_k);
  if (tail_k >= 0) g[tail_k] = grad_at(tail_z, tail_k);
  if (first && threadIdx.x == 0)
    a.row_loss[row] = cross_entropy_value(capped(target_z, a.softcap), stats);
#else
  (void)a;
  (void)plan;
  __trap();  // never launched: the host chooses this kernel on sm_90 and later only
#endif
}

std::atomic<CrossEntropyKernel> kernel_override{CrossEntropyKernel::kAuto};

// The device's limits, read once per device.
DeviceLimits limits_of_current_device() {
  constexpr int kMaxDevices = 64;
  static DeviceLimits cache[kMaxDevices];
  static std::atomic<bool> known[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices)
    throw std::runtime_error("cpkit: cudaGetDevice failed before the cross-entropy launch");
  if (!known[device].load()) {
    int major = 0, cluster = 0, optin = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, device);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cache[device] = {major, cluster != 0, static_cast<std::size_t>(optin)};
    // The cluster kernel's shared-memory limit, set once per device to the most any plan
    // takes (one value: threads that race here write the same one).
    if (major >= 9)
      check_cuda(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(std::min<std::size_t>(
                                          kClusterBlockBudget, cache[device].shared_bytes_optin))),
                 "cudaFuncSetAttribute(cluster_kernel)");
    known[device].store(true);
  }
  return cache[device];
}

// Launches the cluster kernel; false (nothing launched) when the device cannot co-schedule
// a cluster of this plan (its blocks must fit one GPC at once).
bool launch_cluster(const CrossEntropyArgs& args, const ClusterPlan& plan, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.rows * plan.blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = plan.shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster_dims[1];
  cluster_dims[0].id = cudaLaunchAttributeClusterDimension;
  cluster_dims[0].val.clusterDim.x = static_cast<unsigned>(plan.blocks);
  cluster_dims[0].val.clusterDim.y = 1;
  cluster_dims[0].val.clusterDim.z = 1;
  config.attrs = cluster_dims;
  config.numAttrs = 1;
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, cluster_kernel, &config),
             "cudaOccupancyMaxActiveClusters(cluster_kernel)");
  if (clusters == 0) return false;
  check_cuda(cudaLaunchKernelEx(&config, cluster_kernel, args, plan), "cluster_kernel");
  return true;
}

}  // namespace

void set_cuda_cross_entropy_kernel(CrossEntropyKernel kernel) { kernel_override.store(kernel); }

void cross_entropy_cuda(const CrossEntropyArgs& args, void* stream) {
  if (args.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  // "auto" is the two-pass kernel everywhere: on an H200 it beat the cluster kernel at every
  // large vocabulary (6.4 vs 8.0 ms at [16384, 131072], docs/performance.md). The cluster
  // kernel runs only when asked for, until its single read turns into speed.
  if (kernel_override.load() == CrossEntropyKernel::kCluster) {
    // Rows of one call share V but not alignment: plan for the most float4s any row has.
    const ClusterPlan plan = cluster_plan(args.vocab / 4, limits_of_current_device());
    if (plan.blocks > 0 && launch_cluster(args, plan, s)) return;
    throw std::runtime_error(
        "cpkit: the cluster cross-entropy kernel needs sm_90, a row of at "
        "most 8 x 112 KB and a device that co-schedules the cluster; V = " +
        std::to_string(args.vocab));
  }
  checked_launch("two_pass_kernel", [&] {
    two_pass_kernel<<<static_cast<unsigned>(args.rows), kThreads, 0, s>>>(args);
  });
}

}  // namespace cpkit::kernels
