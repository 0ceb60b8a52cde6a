// Mesh over a c10d Backend: raw buffers are wrapped as tensors without copying.
#include <ATen/ATen.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/process_group.hpp"

namespace cpkit {

namespace {

at::ScalarType to_scalar_type(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat32:
      return at::kFloat;
    case ScalarKind::kFloat16:
      return at::kHalf;
    case ScalarKind::kBFloat16:
      return at::kBFloat16;
    case ScalarKind::kInt64:
      return at::kLong;
    case ScalarKind::kUInt8:
      return at::kByte;
    case ScalarKind::kFloat64:
      return at::kDouble;
  }
  return at::kByte;
}

class ProcessGroupCommunicator final : public Communicator {
 public:
  ProcessGroupCommunicator(c10::intrusive_ptr<c10d::Backend> backend, at::Device device,
                           std::chrono::milliseconds timeout, std::string group_name)
      : backend_(std::move(backend)),
        device_(device),
        timeout_(timeout),
        group_name_(std::move(group_name)) {}

  int rank() const override { return backend_->getRank(); }
  int size() const override { return backend_->getSize(); }
  const char* backend() const override { return "c10d"; }
  std::string group_name() const override { return group_name_; }

  void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    at::Tensor out = wrap(recv, count * static_cast<std::size_t>(size()), kind);
    at::Tensor in = wrap(send, count, kind);
    wait(backend_->_allgather_base(out, in), "all_gather");
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t count,
                          ScalarKind kind) override {
    at::Tensor out = wrap(recv, count, kind);
    at::Tensor in = wrap(send, count * static_cast<std::size_t>(size()), kind);
    if (has_reduce_scatter_) {
      try {
        c10d::ReduceScatterOptions options;
        options.reduceOp = c10d::ReduceOp::SUM;
        wait(backend_->_reduce_scatter_base(out, in, options), "reduce_scatter");
        return;
      } catch (const c10::NotImplementedError&) {
        has_reduce_scatter_ = false;
      }
    }
    // Fallback for groups without reduce-scatter: all-to-all moves the same bytes, then each
    // rank sums the slices it received.
    at::Tensor slices = at::empty_like(in);
    std::vector<int64_t> even;
    wait(backend_->alltoall_base(slices, in, even, even), "alltoall (reduce_scatter)");
    at::sum_out(out, slices.view({size(), static_cast<int64_t>(count)}), 0);
  }

  void all_reduce_sum(void* data, std::size_t count, ScalarKind kind) override {
    std::vector<at::Tensor> tensors{wrap(data, count, kind)};
    wait(backend_->allreduce(tensors), "all_reduce");
  }

  void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, ScalarKind kind) override {
    start_all_to_all_v(send, send_counts, recv, recv_counts, kind)();
  }

  std::function<void()> start_all_to_all_v(const void* send,
                                           const std::vector<std::size_t>& send_counts, void* recv,
                                           const std::vector<std::size_t>& recv_counts,
                                           ScalarKind kind) override {
    std::size_t sent = 0, received = 0;
    std::vector<int64_t> send_splits, recv_splits;
    for (const std::size_t n : send_counts) {
      send_splits.push_back(static_cast<int64_t>(n));
      sent += n;
    }
    for (const std::size_t n : recv_counts) {
      recv_splits.push_back(static_cast<int64_t>(n));
      received += n;
    }
    at::Tensor out = wrap(recv, received, kind), in = wrap(send, sent, kind);
    const c10::intrusive_ptr<c10d::Work> work =
        backend_->alltoall_base(out, in, recv_splits, send_splits);
    return [this, work] { wait(work, "all_to_all_v"); };
  }

  void shift_from_next(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    constexpr int kTag = 7001;
    std::vector<at::Tensor> incoming{wrap(recv, count, kind)};
    std::vector<at::Tensor> outgoing{wrap(send, count, kind)};
    // Backends that coalesce (NCCL) run the pair as one group, so the exchange does not
    // serialise around the ring; the others (Gloo) already progress both at once.
    const bool coalesced = backend_->supportsCoalescing();
    if (coalesced) backend_->startCoalescing();
    c10::intrusive_ptr<c10d::Work> received, sent;
    if (rank() + 1 < size()) received = backend_->recv(incoming, rank() + 1, kTag);
    if (rank() > 0) sent = backend_->send(outgoing, rank() - 1, kTag);
    if (coalesced) {
      const c10::intrusive_ptr<c10d::Work> both = backend_->endCoalescing();
      if (both) wait(both, "send/recv with the neighbours (loss halo)");
      return;
    }
    if (received) wait(received, "recv from the next rank (loss halo)");
    if (sent) wait(sent, "send to the previous rank (loss halo)");
  }

 private:
  // A dead or stalled peer surfaces here: every rank raises cpkit::Error naming the
  // operation and the timeout instead of hanging.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* operation) const {
    try {
      work->wait();
    } catch (const c10::NotImplementedError&) {
      throw;
    } catch (const std::exception& e) {
      std::string detail = e.what();
      detail = detail.substr(0, detail.find('\n'));
      const std::string limit = timeout_.count() > 0
                                    ? "the timeout of " + std::to_string(timeout_.count()) + " ms"
                                    : "the process group's timeout";
      raise("mesh", operation, " failed on rank ", rank(), " of ", size(),
            ": a peer died or did not answer within ", limit, " (", detail, ")");
    }
  }

  at::Tensor wrap(const void* data, std::size_t count, ScalarKind kind) const {
    return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(count)},
                         at::TensorOptions().dtype(to_scalar_type(kind)).device(device_));
  }

  c10::intrusive_ptr<c10d::Backend> backend_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  std::string group_name_;
  bool has_reduce_scatter_ = true;
};

}  // namespace

MeshPtr make_process_group_mesh(c10::intrusive_ptr<c10d::Backend> backend, at::Device device,
                                std::chrono::milliseconds timeout, std::string group_name) {
  if (!backend) raise("backend", "is null");
  return std::make_shared<ProcessGroupCommunicator>(std::move(backend), device, timeout,
                                                    std::move(group_name));
}

}  // namespace cpkit
