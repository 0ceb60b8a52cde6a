// Which CUDA cross-entropy kernel a call takes, and how the cluster kernel splits a row
// (plain C++ header, safe for nvcc; tested on the CPU).
//
// The two-pass kernel reads each logit twice: once for the row's statistics, once for its
// gradient. When the rows resident at once exceed L2 (V = 131072: ~400 rows of 512 KB
// against 60 MB), the second read comes from HBM again. The cluster kernel (sm_90 and
// later) reads each logit from HBM once: a row is split across a thread-block cluster, each
// block keeps its part in shared memory, the blocks merge their online-softmax statistics
// through distributed shared memory, and each writes its part's gradient from chip.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.hpp"

namespace cpkit::kernels {

// What the device offers (cudaDevAttr*), read once per device by the launcher.
struct DeviceLimits {
  int compute_major;               // 9 for Hopper
  bool cluster_launch;             // cudaDevAttrClusterLaunch
  std::size_t shared_bytes_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// Shared memory one block of the cluster kernel may take: two blocks per SM (2 x 112 KB of
// Hopper's 228 KB) keep enough loads in flight to saturate HBM.
inline constexpr std::size_t kClusterBlockBudget = 112 * 1024;
// Portable cluster sizes only (no opt-in to 16).
inline constexpr int kMaxCluster = 8;

struct ClusterPlan {
  int blocks;                    // blocks per row (the cluster size); 0: take the two-pass kernel
  std::int64_t quads_per_block;  // float4s of the row's aligned middle each block holds
  std::size_t shared_bytes;      // dynamic shared memory per block
};

// The smallest power-of-two cluster whose blocks each hold at most the budget of the row's
// `quads` float4s; none (blocks = 0) before sm_90, without cluster launch, or when the row
// does not fit in kMaxCluster blocks.
CPKIT_HOST_DEVICE inline ClusterPlan cluster_plan(std::int64_t quads, const DeviceLimits& device) {
  const ClusterPlan none{0, 0, 0};
  if (device.compute_major < 9 || !device.cluster_launch || quads < 1) return none;
  const std::size_t budget = device.shared_bytes_optin < kClusterBlockBudget
                                 ? device.shared_bytes_optin
                                 : kClusterBlockBudget;
  for (int blocks = 1; blocks <= kMaxCluster; blocks *= 2) {
    const std::int64_t per_block = (quads + blocks - 1) / blocks;
    const std::size_t bytes = static_cast<std::size_t>(per_block) * 16;
    if (bytes <= budget) return {blocks, per_block, bytes};
  }
  return none;
}

// The float4s [begin, end) of the aligned middle that block `part` of the cluster holds.
struct QuadRange {
  std::int64_t begin, end;
};

CPKIT_HOST_DEVICE inline QuadRange quads_of_block(const ClusterPlan& plan, int part,
                                                  std::int64_t quads) {
  const std::int64_t begin = static_cast<std::int64_t>(part) * plan.quads_per_block;
  const std::int64_t end = begin + plan.quads_per_block;
  return {begin < quads ? begin : quads, end < quads ? end : quads};
}

// A process-wide override for tests and benchmarks: both kernels on the same inputs.
enum class CrossEntropyKernel { kAuto, kTwoPass, kCluster };

}  // namespace cpkit::kernels
