// NCCL meshes for CUDA tensors (available when cpkit is built with CUDA and NCCL).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// Wraps an initialised ncclComm_t (passed as void*, not owned). Collectives are enqueued on
// the stream `stream()` returns at each call (a cudaStream_t as void*), so they order with
// the caller's kernels without a host synchronisation. A watchdog thread follows each
// operation: one not complete after `timeout` (a dead or stalled peer) or an asynchronous
// NCCL error aborts the communicator (ncclCommAbort), and the next operation on the mesh
// raises cpkit::Error naming the one that failed.
MeshPtr make_nccl_mesh(void* nccl_comm, std::function<void*()> stream,
                       std::chrono::milliseconds timeout = std::chrono::minutes(5));

// Creates a communicator for `size` processes (one GPU each, `device` here): rank 0's NCCL
// unique id reaches the others through a FileStore at `store_path`. Collectives run on
// PyTorch's current CUDA stream. The mesh owns and destroys the communicator; `timeout` as
// for make_nccl_mesh.
MeshPtr make_nccl_mesh_from_store(const std::string& store_path, int rank, int size, int device,
                                  std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace cpkit
