// NCCL meshes over a c10d Store: the unique id travels through the store; collectives use
// PyTorch's current CUDA stream.
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "comm/nccl_internal.hpp"
#include "comm/store_meshes.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/nccl_mesh.hpp"

namespace cpkit {

namespace detail {

MeshPtr nccl_mesh_over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             int device, std::chrono::milliseconds timeout) {
  if (size < 1) raise("size", "must be >= 1, got ", size);
  if (rank < 0 || rank >= size) raise("rank", "must be in [0, ", size, "), got ", rank);
  const std::string key = next_mesh_key(*store, "nccl_unique_id", rank);
  if (rank == 0) {
    const std::vector<char> id = nccl_unique_id();
    store->set(key, std::vector<uint8_t>(id.begin(), id.end()));
  }
  const std::vector<uint8_t> bytes = store->get(key);
  const auto index = static_cast<c10::DeviceIndex>(device);
  return nccl_mesh_from_id(
      std::vector<char>(bytes.begin(), bytes.end()), rank, size, device,
      [index] { return static_cast<void*>(c10::cuda::getCurrentCUDAStream(index).stream()); },
      timeout);
}

}  // namespace detail

MeshPtr make_nccl_mesh_from_store(const std::string& store_path, int rank, int size, int device,
                                  std::chrono::milliseconds timeout) {
  if (size < 1) raise("size", "must be >= 1, got ", size);
  return detail::nccl_mesh_over_store(c10::make_intrusive<c10d::FileStore>(store_path, size), rank,
                                      size, device, timeout);
}

}  // namespace cpkit
