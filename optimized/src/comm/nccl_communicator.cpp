// Raw NCCL behind the Communicator interface: device buffers, the caller's stream.
#include <cuda_runtime.h>
#include <nccl.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/nccl_mesh.hpp"
#include "nccl_internal.hpp"

namespace cpkit {

namespace {

ncclDataType_t nccl_type(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat32:
      return ncclFloat32;
    case ScalarKind::kFloat16:
      return ncclFloat16;
    case ScalarKind::kBFloat16:
      return ncclBfloat16;
    case ScalarKind::kInt64:
      return ncclInt64;
    case ScalarKind::kUInt8:
      return ncclUint8;
  }
  return ncclUint8;
}

void check(ncclResult_t result, const char* operation) {
  if (result != ncclSuccess)
    raise("mesh", "NCCL ", operation, " failed: ", ncclGetErrorString(result));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::function<void*()> stream, bool owned)
      : comm_(comm), stream_(std::move(stream)), owned_(owned) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  ~NcclCommunicator() override {
    if (owned_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    check(ncclAllGather(send, recv, count, nccl_type(kind), comm_, stream()), "all-gather");
  }
  void reduce_scatter_sum(const void* send, void* recv, std::size_t count,
                          ScalarKind kind) override {
    check(ncclReduceScatter(send, recv, count, nccl_type(kind), ncclSum, comm_, stream()),
          "reduce-scatter");
  }
  void all_reduce_sum(void* data, std::size_t count, ScalarKind kind) override {
    check(ncclAllReduce(data, data, count, nccl_type(kind), ncclSum, comm_, stream()),
          "all-reduce");
  }
  void shift_from_next(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    check(ncclGroupStart(), "group start");
    if (rank_ + 1 < size_)
      check(ncclRecv(recv, count, nccl_type(kind), rank_ + 1, comm_, stream()), "recv");
    if (rank_ > 0)
      check(ncclSend(send, count, nccl_type(kind), rank_ - 1, comm_, stream()), "send");
    check(ncclGroupEnd(), "group end");
  }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_()); }

  ncclComm_t comm_;
  std::function<void*()> stream_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MeshPtr make_nccl_mesh(void* nccl_comm, std::function<void*()> stream) {
  if (nccl_comm == nullptr) raise("nccl_comm", "is null");
  return std::make_shared<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), std::move(stream),
                                            /*owned=*/false);
}

namespace detail {

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
}

MeshPtr nccl_mesh_from_id(const std::vector<char>& id_bytes, int rank, int size, int device,
                          std::function<void*()> stream) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id.internal))
    raise("store", "NCCL unique id has ", id_bytes.size(), " bytes, expected ",
          sizeof(id.internal));
  std::copy(id_bytes.begin(), id_bytes.end(), id.internal);
  if (cudaSetDevice(device) != cudaSuccess) raise("device", "cudaSetDevice(", device, ") failed");
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  return std::make_shared<NcclCommunicator>(comm, std::move(stream), /*owned=*/true);
}

}  // namespace detail
}  // namespace cpkit
