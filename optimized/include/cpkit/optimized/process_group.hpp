// Mesh adapters over c10d: a Backend the trainer already holds (ProcessGroupGloo on CPU,
// ProcessGroupNCCL on CUDA), and a self-contained Gloo world for tests and tools.
#pragma once

#include <ATen/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

// Wraps `backend`; buffers passed to the mesh must live on `device`. `timeout` (the group's
// own) only names the limit in the error a dead or stalled peer raises; 0: unknown.
// `group_name` (c10d's name of the group, if any) becomes Communicator::group_name().
MeshPtr make_process_group_mesh(c10::intrusive_ptr<c10d::Backend> backend, at::Device device,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(0),
                                std::string group_name = "");

// A Gloo world over loopback: `size` processes rendezvous through a FileStore at
// `store_path`; every collective fails after `timeout` instead of hanging.
MeshPtr make_gloo_mesh(const std::string& store_path, int rank, int size,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace cpkit
