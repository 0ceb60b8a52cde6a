// Raw NCCL behind the Communicator interface: device buffers, the caller's stream. A
// watchdog (comm/fault_watch.hpp) follows every enqueued operation through a CUDA event, so
// a dead peer ends in an error naming the operation within the timeout, never a hang.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <optional>

#include "comm/fault_watch.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/nccl_mesh.hpp"
#include "nccl_internal.hpp"

namespace cpkit {

namespace {

using detail::EngineState;
using detail::Progress;
using detail::wait_settled;

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
    case ScalarKind::kFloat64:
      return ncclFloat64;
  }
  return ncclUint8;
}

void check(ncclResult_t result, const char* operation) {
  if (result != ncclSuccess)
    raise("mesh", "NCCL ", operation, " failed: ", ncclGetErrorString(result));
}

// A non-blocking communicator's calls may return ncclInProgress: started, not failed.
void check_started(ncclResult_t result, const char* operation) {
  if (result != ncclInProgress) check(result, operation);
}

EngineState engine_state(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
    return {Progress::kFailed, "ncclCommGetAsyncError failed"};
  if (state == ncclSuccess) return {Progress::kDone, ""};
  if (state == ncclInProgress) return {Progress::kInProgress, ""};
  return {Progress::kFailed, ncclGetErrorString(state)};
}

// Waits (at most `timeout`) for a call of a non-blocking communicator to finish; raises what
// failed.
void settle(ncclComm_t comm, const char* operation, std::chrono::milliseconds timeout) {
  const std::string failed = wait_settled([comm] { return engine_state(comm); }, timeout);
  if (!failed.empty()) raise("mesh", "NCCL ", operation, " failed: ", failed);
}

// ncclGroupEnd runs on every path out of a group, a throwing check included: a group left
// open would swallow the next operation on this thread.
class NcclGroup {
 public:
  NcclGroup() { check_started(ncclGroupStart(), "group start"); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

// Restores the current CUDA device on scope exit.
class DeviceRestore {
 public:
  DeviceRestore() { cudaGetDevice(&device_); }
  ~DeviceRestore() { cudaSetDevice(device_); }
  DeviceRestore(const DeviceRestore&) = delete;
  DeviceRestore& operator=(const DeviceRestore&) = delete;

 private:
  int device_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::function<void*()> stream, bool owned,
                   std::chrono::milliseconds timeout)
      : comm_(comm), stream_(std::move(stream)), owned_(owned), timeout_(timeout) {
    if (timeout.count() <= 0) raise("timeout", "must be positive, got ", timeout.count(), " ms");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    // The communicator's own device (a caller's communicator may have been made on a device
    // that is not current now): its stream and completion events live there.
    check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
    watch_.emplace(watch_hooks(), timeout);
  }
  // Never hangs on a dead peer: finalize is waited on for at most the timeout, then the
  // communicator is aborted instead of destroyed.
  ~NcclCommunicator() override {
    const bool failed = !watch_->fault().empty();
    watch_.reset();  // stops the watchdog before the communicator goes
    if (!owned_ || aborted_.load()) return;
    const ncclResult_t finalize = ncclCommFinalize(comm_);
    const bool clean = !failed && (finalize == ncclSuccess || finalize == ncclInProgress) &&
                       wait_settled([this] { return engine_state(comm_); }, timeout_).empty();
    if (clean)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    run("all-gather", [&](cudaStream_t s) {
      return ncclAllGather(send, recv, count, nccl_type(kind), comm_, s);
    });
  }
  void reduce_scatter_sum(const void* send, void* recv, std::size_t count,
                          ScalarKind kind) override {
    run("reduce-scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(send, recv, count, nccl_type(kind), ncclSum, comm_, s);
    });
  }
  void all_reduce_sum(void* data, std::size_t count, ScalarKind kind) override {
    run("all-reduce", [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, nccl_type(kind), ncclSum, comm_, s);
    });
  }
  // One group of sends and receives (one pair per peer with anything to move); this rank's
  // own slice is a device-to-device copy on the same stream.
  void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, ScalarKind kind) override {
    if (send_counts.size() != static_cast<std::size_t>(size_) ||
        recv_counts.size() != static_cast<std::size_t>(size_))
      raise("mesh", "all_to_all_v needs one count per rank (", size_, "), got ", send_counts.size(),
            " and ", recv_counts.size());
    const std::size_t item = scalar_bytes(kind);
    run("all-to-all-v", [&](cudaStream_t s) {
      NcclGroup group;
      std::size_t send_at = 0, recv_at = 0;
      for (int q = 0; q < size_; ++q) {
        const auto n_send = send_counts[static_cast<std::size_t>(q)];
        const auto n_recv = recv_counts[static_cast<std::size_t>(q)];
        const char* from = static_cast<const char*>(send) + send_at * item;
        char* to = static_cast<char*>(recv) + recv_at * item;
        if (q == rank_) {
          if (n_send != n_recv)
            raise("mesh", "all_to_all_v keeps ", n_send, " elements on rank ", rank_,
                  " but expects ", n_recv);
          if (n_send > 0 &&
              cudaMemcpyAsync(to, from, n_send * item, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            raise("mesh", "the local copy of all_to_all_v failed");
        } else {
          if (n_send > 0)
            check_started(ncclSend(from, n_send, nccl_type(kind), q, comm_, s), "send");
          if (n_recv > 0) check_started(ncclRecv(to, n_recv, nccl_type(kind), q, comm_, s), "recv");
        }
        send_at += n_send;
        recv_at += n_recv;
      }
      return group.end();
    });
  }

  // One group: the receive from r + 1 and the send to r - 1 progress together, so the
  // exchange does not serialise around the ring.
  void shift_from_next(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    run("loss-halo send/recv", [&](cudaStream_t s) {
      NcclGroup group;
      if (rank_ + 1 < size_)
        check_started(ncclRecv(recv, count, nccl_type(kind), rank_ + 1, comm_, s), "recv");
      if (rank_ > 0)
        check_started(ncclSend(send, count, nccl_type(kind), rank_ - 1, comm_, s), "send");
      return group.end();
    });
  }

 private:
  // Enqueues one operation on the caller's stream (under the watch's lock: no abort can free
  // the communicator meanwhile) and hands the watchdog an event recorded after it.
  template <class Enqueue>
  void run(const char* operation, Enqueue&& enqueue) {
    watch_->enqueue(operation, [&]() -> void* {
      // The event must be created on the stream's device: a trainer that never called
      // cudaSetDevice has device 0 current on every rank.
      const DeviceRestore restore;
      if (cudaSetDevice(device_) != cudaSuccess)
        raise("mesh", "cudaSetDevice(", device_, ") before NCCL ", operation, " failed");
      const cudaStream_t s = static_cast<cudaStream_t>(stream_());
      const ncclResult_t started = enqueue(s);
      check_started(started, operation);
      if (started == ncclInProgress) settle(comm_, operation, timeout_);
      // Inside CUDA-graph capture the operation runs only at replay, which the watchdog
      // cannot follow; replays are waited on by the caller.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(s, &capture) != cudaSuccess ||
          capture != cudaStreamCaptureStatusNone)
        return nullptr;
      cudaEvent_t event = nullptr;
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(event, s) != cudaSuccess) {
        if (event != nullptr) cudaEventDestroy(event);
        raise("mesh", "recording a CUDA event after NCCL ", operation, " failed");
      }
      return event;
    });
  }

  detail::FaultWatch::Hooks watch_hooks() {
    return {
        .done =
            [this](void* event) {
              prepare_watch_thread();
              // Any answer but "not ready" ends the wait: errors surface on the stream.
              return cudaEventQuery(static_cast<cudaEvent_t>(event)) != cudaErrorNotReady;
            },
        .release = [](void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); },
        .engine_error = [this]() -> std::string {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess)
            return "ncclCommGetAsyncError failed";
          if (state == ncclSuccess || state == ncclInProgress) return "";
          return ncclGetErrorString(state);
        },
        // Only a communicator cpkit made is aborted (in-flight kernels exit, waits on the
        // stream return). A caller's (make_nccl_mesh) is theirs to abort: aborting frees it,
        // and their own destroy would then free it twice. The recorded fault stops every
        // later operation either way.
        .abort =
            [this] {
              if (!owned_) return;
              aborted_.store(true);
              ncclCommAbort(comm_);
            },
    };
  }

  // Runs on the watchdog thread before each query: the communicator's device, and
  // thread-local capture mode, so its event queries never invalidate a global-mode CUDA-graph
  // capture (torch.cuda.graph's default) running on another thread, as PyTorch's own NCCL
  // watchdog does.
  void prepare_watch_thread() const {
    thread_local int current = -1;
    if (current != device_ && cudaSetDevice(device_) == cudaSuccess) current = device_;
    thread_local bool thread_local_mode = false;
    if (!thread_local_mode) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
      thread_local_mode = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    }
  }

  ncclComm_t comm_;
  std::function<void*()> stream_;
  bool owned_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::atomic<bool> aborted_{false};
  std::optional<detail::FaultWatch> watch_;
};

}  // namespace

MeshPtr make_nccl_mesh(void* nccl_comm, std::function<void*()> stream,
                       std::chrono::milliseconds timeout) {
  if (nccl_comm == nullptr) raise("nccl_comm", "is null");
  return std::make_shared<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), std::move(stream),
                                            /*owned=*/false, timeout);
}

namespace detail {

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
}

MeshPtr nccl_mesh_from_id(const std::vector<char>& id_bytes, int rank, int size, int device,
                          std::function<void*()> stream, std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id.internal))
    raise("store", "NCCL unique id has ", id_bytes.size(), " bytes, expected ",
          sizeof(id.internal));
  std::copy(id_bytes.begin(), id_bytes.end(), id.internal);
  const DeviceRestore restore;  // the caller's current device is theirs
  if (cudaSetDevice(device) != cudaSuccess) raise("device", "cudaSetDevice(", device, ") failed");
  // Non-blocking init, polled: a peer that never joins raises within the timeout instead of
  // blocking ncclCommInitRank forever.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  check_started(ncclCommInitRankConfig(&comm, size, id, rank, &config), "ncclCommInitRankConfig");
  const std::string failed = wait_settled([comm] { return engine_state(comm); }, timeout);
  if (!failed.empty()) {
    ncclCommAbort(comm);
    raise("mesh", "NCCL init of rank ", rank, " of ", size, " failed: ", failed);
  }
  return std::make_shared<NcclCommunicator>(comm, std::move(stream), /*owned=*/true, timeout);
}

}  // namespace detail
}  // namespace cpkit
