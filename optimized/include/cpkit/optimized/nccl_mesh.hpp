// NCCL meshes for CUDA tensors (available when cpkit is built with CUDA and NCCL).
#pragma once

#include <functional>
#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// Wraps an initialised ncclComm_t (passed as void*, not owned). Collectives are enqueued on
// the stream `stream()` returns at each call (a cudaStream_t as void*), so they order with
// the caller's kernels without a host synchronisation.
MeshPtr make_nccl_mesh(void* nccl_comm, std::function<void*()> stream);

// Creates a communicator for `size` processes (one GPU each, `device` here): rank 0's NCCL
// unique id reaches the others through a FileStore at `store_path`. Collectives run on
// PyTorch's current CUDA stream. The mesh owns and destroys the communicator.
MeshPtr make_nccl_mesh_from_store(const std::string& store_path, int rank, int size, int device);

}  // namespace cpkit
