// CP = 2 and 4 on one GPU: rank processes share GPU 0, their collectives staged over Gloo
// (staged_mesh.hpp). Every rank runs the same step on CPU tensors over the Gloo mesh and on
// CUDA tensors over the staged mesh (CUDA sharding, gather, CUDA loss kernel, fused head,
// cp_attention) and requires the two to agree. The parent never touches CUDA (forked children could
// not).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_processes.hpp"
#include "staged_mesh.hpp"

namespace cpkit {
namespace {

const at::Device kCuda(at::kCUDA, 0);

CPBatch bshd_batch(at::Device device) {
  at::manual_seed(21);
  CPBatch b;
  b.input_ids = at::randint(1, 997, {2, 45}, at::kLong).to(device);
  b.labels = at::randint(0, 997, {2, 45}, at::kLong).to(device);
  b.attention_mask = at::ones({2, 45}, at::kLong);
  b.attention_mask.narrow(1, 0, 3).select(0, 1).zero_();  // left padding in row 1
  b.attention_mask = b.attention_mask.to(device);
  return b;
}

struct Step {
  at::Tensor ids, positions, loss, grad, gathered, head_loss, dhidden, dweight;
};

// One CP step on `device`: shard, gather the ids as keys, loss on logits cut from one global
// tensor, the fused head on hidden states cut the same way.
Step run_step(at::Device device, const MeshPtr& mesh) {
  const Sharder s = prepare_cp_inputs(bshd_batch(device), mesh, 1, true, {2, 0});
  const LocalShard l = s.local(0);
  at::manual_seed(22);
  const int64_t V = 997, H = 32, rows = l.labels.size(0);
  const at::Tensor global_logits = at::randn({rows, l.layout.padded_len, V}) * 3;
  const at::Tensor global_hidden = at::randn({rows, l.layout.padded_len, H});
  const at::Tensor weight = (at::randn({V, H}) * 0.3).to(device).requires_grad_(true);
  Step out;
  out.ids = l.input_ids.cpu();
  out.positions = l.position_ids.cpu();
  out.gathered = gather_tokens(l.position_ids.t().contiguous(), mesh, false).cpu();
  const at::Tensor logits =
      global_logits.narrow(1, l.layout.fragments.front().begin, l.layout.local_len)
          .contiguous()
          .to(device)
          .requires_grad_(true);
  const at::Tensor loss = shifted_cp_loss(logits, l.labels, l.valid, mesh, {.softcap = 30.0});
  out.loss = loss.detach().cpu();
  out.grad = torch::autograd::grad({loss}, {logits})[0].cpu();
  const at::Tensor hidden =
      global_hidden.narrow(1, l.layout.fragments.front().begin, l.layout.local_len)
          .contiguous()
          .to(device)
          .requires_grad_(true);
  LinearLossOptions options;
  options.chunk_rows = 5;
  const at::Tensor head = shifted_cp_linear_loss(hidden, weight, l.labels, l.valid, mesh, options);
  out.head_loss = head.detach().cpu();
  const auto grads = torch::autograd::grad({head}, {hidden, weight});
  out.dhidden = grads[0].cpu();
  out.dweight = grads[1].cpu();
  return out;
}

class CpOnOneGpu : public ::testing::TestWithParam<int> {};

TEST_P(CpOnOneGpu, CudaStepEqualsCpuStep) {
  const auto outcomes = ranks::run_ranks(
      GetParam(),
      [](int, const MeshPtr& gloo) {
        const Step cpu = run_step(at::kCPU, gloo);
        const Step gpu = run_step(kCuda, std::make_shared<testing::StagedMesh>(gloo));
        ranks::require_equal(gpu.ids, cpu.ids, "input_ids");
        ranks::require_equal(gpu.positions, cpu.positions, "position_ids");
        ranks::require_equal(gpu.gathered, cpu.gathered, "gathered positions");
        ranks::require_close(gpu.loss, cpu.loss, 1e-5, 1e-5, "loss");
        ranks::require_close(gpu.grad, cpu.grad, 1e-7, 1e-4, "logits gradient");
        ranks::require_close(gpu.head_loss, cpu.head_loss, 1e-4, 1e-4, "head loss");
        ranks::require_close(gpu.dhidden, cpu.dhidden, 1e-5, 1e-3, "d hidden");
        ranks::require_close(gpu.dweight, cpu.dweight, 1e-5, 1e-3, "d weight");
      },
      std::chrono::seconds(120));
  for (const auto& o : outcomes) EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
}

// cp_attention on a balanced packed row (documents cut across ranks, a rank holding two
// pieces of one): the needed keys out and their gradients back through the staged mesh.
struct AttentionStep {
  at::Tensor out, dq, dk, dv;
};

AttentionStep attention_step(at::Device device, const MeshPtr& mesh, int rank) {
  CPBatch b;
  b.input_ids = at::ones({1, 512}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(std::vector<int64_t>{190, 7, 64, 230}).unsqueeze(0);
  b.qkv_format = "thd";
  const Sharder s = prepare_packed_cp_inputs(b, mesh, 1, true, {.layout = LayoutKind::kBalanced});
  const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, rank, 0));
  at::manual_seed(40 + rank);
  const int64_t L = plan->local_len;
  const at::Tensor q = at::randn({1, L, 4, 48}).to(device).requires_grad_(true);
  const at::Tensor k = at::randn({1, L, 2, 48}).to(device).requires_grad_(true);
  const at::Tensor v = at::randn({1, L, 2, 48}).to(device).requires_grad_(true);
  const at::Tensor g = at::randn({1, L, 4, 48}).to(device);
  CpAttentionOptions options;
  options.softcap = 30.0;
  const CpAttentionOutput o = cp_attention(q, k, v, plan, mesh, options);
  const auto grads = torch::autograd::grad({o.out}, {q, k, v}, {g});
  return {o.out.detach().cpu(), grads[0].cpu(), grads[1].cpu(), grads[2].cpu()};
}

TEST_P(CpOnOneGpu, CudaCpAttentionEqualsCpu) {
  const auto outcomes = ranks::run_ranks(
      GetParam(),
      [](int rank, const MeshPtr& gloo) {
        const AttentionStep cpu = attention_step(at::kCPU, gloo, rank);
        const AttentionStep gpu =
            attention_step(kCuda, std::make_shared<testing::StagedMesh>(gloo), rank);
        ranks::require_close(gpu.out, cpu.out, 1e-5, 1e-4, "attention out");
        ranks::require_close(gpu.dq, cpu.dq, 1e-5, 1e-4, "attention dq");
        ranks::require_close(gpu.dk, cpu.dk, 1e-5, 1e-4, "attention dk");
        ranks::require_close(gpu.dv, cpu.dv, 1e-5, 1e-4, "attention dv");
      },
      std::chrono::seconds(120));
  for (const auto& o : outcomes) EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
}

INSTANTIATE_TEST_SUITE_P(Cp, CpOnOneGpu, ::testing::Values(2, 4));

}  // namespace
}  // namespace cpkit
