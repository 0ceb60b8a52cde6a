// Between the raw NCCL backend and its LibTorch-side factory (internal header, no NCCL types).
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::detail {

std::vector<char> nccl_unique_id();
MeshPtr nccl_mesh_from_id(const std::vector<char>& id, int rank, int size, int device,
                          std::function<void*()> stream, std::chrono::milliseconds timeout);

}  // namespace cpkit::detail
