// CP = 2 and 4 on one GPU: rank processes share GPU 0, their collectives staged over Gloo
// (staged_mesh.hpp). Every rank runs the same step on CPU tensors over the Gloo mesh and on
// CUDA tensors over the staged mesh (CUDA sharding, gather, CUDA loss kernel, fused head,
// cp_attention) and requires the two to agree. The parent never touches CUDA (forked children could
// not).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <utility>

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

// cp_attention on a packed row (balanced: documents cut across ranks, a rank holding two
// pieces of one): the needed keys out and their gradients back through the staged mesh. In
// float32 with a soft cap on cpkit's CUDA kernels; in bfloat16 with GQA on torch's flash
// kernels (no window: own and received keys merged by log-sum-exp; a window: queries split
// by the keys they see), against cpkit's CPU kernels on the same bfloat16 inputs.
struct AttentionStep {
  at::Tensor out, dq, dk, dv;
};

struct AttentionCase {
  LayoutKind layout = LayoutKind::kBalanced;
  at::ScalarType dtype = at::kFloat;
  double softcap = 0.0;
  int64_t window = 0, head_dim = 48;
};

AttentionStep attention_step(at::Device device, const MeshPtr& mesh, int rank,
                             const AttentionCase& c) {
  CPBatch b;
  b.input_ids = at::ones({1, 512}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(std::vector<int64_t>{190, 7, 64, 230}).unsqueeze(0);
  b.qkv_format = "thd";
  const Sharder s = prepare_packed_cp_inputs(b, mesh, 1, true, {.layout = c.layout});
  const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, rank, c.window));
  at::manual_seed(40 + rank);
  const int64_t L = plan->local_len, d = c.head_dim;
  auto input = [&](int64_t heads, bool grad) {
    return at::randn({1, L, heads, d}).to(c.dtype).to(device).requires_grad_(grad);
  };
  const at::Tensor q = input(4, true), k = input(2, true), v = input(2, true);
  const at::Tensor g = input(4, false);
  CpAttentionOptions options;
  options.softcap = c.softcap;
  const CpAttentionOutput o = cp_attention(q, k, v, plan, mesh, options);
  const auto grads = torch::autograd::grad({o.out}, {q, k, v}, {g});
  auto host = [](const at::Tensor& t) { return t.detach().cpu().to(at::kFloat); };
  return {host(o.out), host(grads[0]), host(grads[1]), host(grads[2])};
}

void expect_attention_agrees(int cp, const AttentionCase& c, double atol, double rtol) {
  const auto outcomes = ranks::run_ranks(
      cp,
      [&](int rank, const MeshPtr& gloo) {
        const AttentionStep cpu = attention_step(at::kCPU, gloo, rank, c);
        const AttentionStep gpu =
            attention_step(kCuda, std::make_shared<testing::StagedMesh>(gloo), rank, c);
        ranks::require_close(gpu.out, cpu.out, atol, rtol, "attention out");
        ranks::require_close(gpu.dq, cpu.dq, atol, rtol, "attention dq");
        ranks::require_close(gpu.dk, cpu.dk, atol, rtol, "attention dk");
        ranks::require_close(gpu.dv, cpu.dv, atol, rtol, "attention dv");
      },
      std::chrono::seconds(120));
  for (const auto& o : outcomes) EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
}

TEST_P(CpOnOneGpu, CudaCpAttentionEqualsCpu) {
  expect_attention_agrees(GetParam(), {.softcap = 30.0}, 1e-5, 1e-4);
}

TEST_P(CpOnOneGpu, FlashCpAttentionEqualsCpu) {
  for (const auto& [layout, window] : {std::pair{LayoutKind::kBalanced, int64_t{0}},
                                       {LayoutKind::kContiguous, int64_t{0}},
                                       {LayoutKind::kBalanced, int64_t{48}},
                                       {LayoutKind::kHeadTail, int64_t{48}}}) {
    SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + ", window " +
                 std::to_string(window));
    expect_attention_agrees(
        GetParam(), {.layout = layout, .dtype = at::kBFloat16, .window = window, .head_dim = 64},
        2e-2, 2e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Cp, CpOnOneGpu, ::testing::Values(2, 4));

}  // namespace
}  // namespace cpkit
