// A CP step on CUDA tensors makes no host synchronisation: sharding (a BSHD cut at CP 4), a
// collective over an NCCL mesh, the fused loss forward and its in-place backward scaling by
// a device-side upstream are captured into a CUDA graph. Any synchronisation (an .item(), a
// pageable copy, a blocking cudaMemcpy) is illegal during capture and fails the test; the
// replayed graph must then reproduce the eager step.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/nccl_mesh.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit {
namespace {

const at::Device kCuda(at::kCUDA, 0);

struct StepOut {
  at::Tensor gathered, loss, grad;
};

// One rank's step: shard (rank 1 of CP 4), gather its embeddings, loss and backward.
StepOut step(const CPBatch& batch, const at::Tensor& logits, const at::Tensor& upstream,
             const MeshPtr& mesh) {
  const Sharder sharder = prepare_cp_inputs_for(batch, 4, 1);
  const LocalShard shard = sharder.local(0, 1);
  StepOut out;
  out.gathered = at::empty_like(shard.inputs_embeds);
  mesh->all_gather(shard.inputs_embeds.data_ptr(), out.gathered.data_ptr(),
                   shard.inputs_embeds.numel(), ScalarKind::kFloat32);
  LossWithGrad loss = shifted_cp_loss_with_grad(logits, shard.labels, shard.valid, nullptr);
  scale_loss_gradient_(loss.grad_logits, upstream);
  out.loss = loss.loss;
  out.grad = loss.grad_logits;
  return out;
}

struct StepInputs {
  CPBatch batch;
  at::Tensor logits, upstream;
};

StepInputs step_inputs() {
  at::manual_seed(5);
  const auto on_gpu = at::TensorOptions().device(kCuda);
  StepInputs in;
  in.batch.inputs_embeds = at::randn({4, 37, 16}, on_gpu);
  in.batch.labels = at::randint(0, 300, {4, 37}, on_gpu.dtype(at::kLong));
  in.batch.attention_mask = (at::rand({4, 37}, on_gpu) > 0.2).to(at::kLong);
  in.logits = at::randn({4, shard_layout(37, 4, 1).local_len, 300}, on_gpu) * 3;
  in.upstream = at::full({}, 0.5, on_gpu);
  return in;
}

// Captures one step on a side stream in `mode` (holding the capture open for `hold`),
// replays it, and compares with the eager step.
void expect_capture_replays_eager(const MeshPtr& mesh, const StepInputs& in,
                                  cudaStreamCaptureMode mode,
                                  std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
  const StepOut eager = step(in.batch, in.logits, in.upstream, mesh);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  StepOut captured;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin({0, 0}, mode);
    captured = step(in.batch, in.logits, in.upstream, mesh);  // throws on any synchronisation
    std::this_thread::sleep_for(hold);
    graph.capture_end();
  }
  graph.replay();
  side.synchronize();
  EXPECT_TRUE(at::equal(captured.gathered, eager.gathered));
  EXPECT_TRUE(at::allclose(captured.loss, eager.loss, 1e-6, 0));
  EXPECT_TRUE(at::allclose(captured.grad, eager.grad, 1e-6, 0));
  EXPECT_GT(eager.grad.abs().sum().item<float>(), 0.0f);  // the step did real work
}

TEST(NoHostSync, CpStepCapturesIntoACudaGraph) {
  const std::string store = "/tmp/cpkit-nccl-graph-" + std::to_string(getpid());
  const MeshPtr mesh = make_nccl_mesh_from_store(store, 0, 1, 0);
  expect_capture_replays_eager(mesh, step_inputs(), cudaStreamCaptureModeThreadLocal);
  unlink(store.c_str());
}

// torch.cuda.graph captures in global mode, where another thread's "unsafe" CUDA call (an
// event query) invalidates the capture. The NCCL watchdog polls its events from its own
// thread: with an eager collective still pending (queued behind a ~0.2 s spin) while this
// thread captures, the capture must survive the watchdog's queries.
TEST(NoHostSync, GlobalModeCaptureSurvivesThePendingWatchdog) {
  const std::string store = "/tmp/cpkit-nccl-global-" + std::to_string(getpid());
  const MeshPtr mesh = make_nccl_mesh_from_store(store, 0, 1, 0);
  const at::Tensor x = at::arange(64, at::TensorOptions().dtype(at::kFloat).device(kCuda));
  at::Tensor y = at::empty_like(x);
  at::cuda::sleep(400'000'000);  // ~0.2 s at 2 GHz on the current stream
  mesh->all_gather(x.data_ptr(), y.data_ptr(), 64, ScalarKind::kFloat32);  // watched, pending
  // Held long enough for several watchdog polls (every 20 ms) of the pending event.
  expect_capture_replays_eager(mesh, step_inputs(), cudaStreamCaptureModeGlobal,
                               std::chrono::milliseconds(100));
  EXPECT_TRUE(at::equal(y.cpu(), x.cpu()));
  unlink(store.c_str());
}

// THD sharding of CUDA tensors copies its document offsets from the host: inside capture it
// raises, naming them, instead of recording a copy that a replay would feed stale offsets.
TEST(NoHostSync, PackedShardingRefusesCapture) {
  CPBatch b;
  b.qkv_format = "thd";
  b.input_ids =
      at::arange(100, 120, at::TensorOptions().dtype(at::kLong).device(kCuda)).unsqueeze(0);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(std::vector<int64_t>{7, 13}, at::kLong).unsqueeze(0);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      prepare_packed_cp_inputs_for(b, 2, 1).local(0, 1);
      ADD_FAILURE() << "THD sharding was captured";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("document offsets come from the host"),
                std::string::npos)
          << e.what();
    }
    graph.capture_end();
  }
}

}  // namespace
}  // namespace cpkit
