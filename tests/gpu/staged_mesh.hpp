// A CP mesh for CUDA tensors over a host collective engine (test-only): each collective copies
// the device buffers to the host, runs the Gloo mesh's collective there, and copies the
// result back. NCCL refuses two ranks on one GPU; this lets CP = 2 and 4 rank processes share
// the one GPU a check machine has, so the CUDA kernels and CUDA sharding run at CP > 1.
// Copies use cudaMemcpyDefault: a buffer the library keeps on the host passes through too.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::testing {

class StagedMesh final : public Communicator {
 public:
  explicit StagedMesh(MeshPtr host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "staged-gloo"; }

  void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    const std::size_t n = count * scalar_bytes(kind), all = n * static_cast<std::size_t>(size());
    std::vector<char> in = to_host(send, n), out(all);
    host_->all_gather(in.data(), out.data(), count, kind);
    to_device(recv, out);
  }
  void reduce_scatter_sum(const void* send, void* recv, std::size_t count,
                          ScalarKind kind) override {
    const std::size_t n = count * scalar_bytes(kind);
    std::vector<char> in = to_host(send, n * static_cast<std::size_t>(size())), out(n);
    host_->reduce_scatter_sum(in.data(), out.data(), count, kind);
    to_device(recv, out);
  }
  void all_reduce_sum(void* data, std::size_t count, ScalarKind kind) override {
    std::vector<char> buffer = to_host(data, count * scalar_bytes(kind));
    host_->all_reduce_sum(buffer.data(), count, kind);
    to_device(data, buffer);
  }
  void shift_from_next(const void* send, void* recv, std::size_t count, ScalarKind kind) override {
    const std::size_t n = count * scalar_bytes(kind);
    std::vector<char> in = to_host(send, n), out = to_host(recv, n);  // last rank keeps recv
    host_->shift_from_next(in.data(), out.data(), count, kind);
    to_device(recv, out);
  }
  void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, ScalarKind kind) override {
    std::size_t out = 0, in = 0;
    for (const std::size_t n : send_counts) out += n * scalar_bytes(kind);
    for (const std::size_t n : recv_counts) in += n * scalar_bytes(kind);
    std::vector<char> sending = to_host(send, out), receiving(in);
    host_->all_to_all_v(sending.data(), send_counts, receiving.data(), recv_counts, kind);
    to_device(recv, receiving);
  }

 private:
  static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess)
      throw std::runtime_error(std::string("StagedMesh: ") + what + ": " +
                               cudaGetErrorString(status));
  }
  // The kernels that produced the buffer run on PyTorch's stream: wait for them first.
  static std::vector<char> to_host(const void* device, std::size_t n) {
    std::vector<char> host(n);
    check(cudaDeviceSynchronize(), "synchronise");
    if (n > 0) check(cudaMemcpy(host.data(), device, n, cudaMemcpyDefault), "copy to host");
    return host;
  }
  static void to_device(void* device, const std::vector<char>& host) {
    if (!host.empty())
      check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyDefault), "copy to device");
  }
  MeshPtr host_;
};

}  // namespace cpkit::testing
