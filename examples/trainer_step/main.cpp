// One real context-parallel training step on cpkit, started by torchrun (or srun):
//   mesh from the launcher's variables -> packed documents -> sharder -> an attention layer
//   through cp_attention (each rank receives only the keys its queries may see) -> LM head ->
//   shifted_cp_loss -> backward -> gradients averaged over the CP group (as FSDP or DDP
//   would).
// Every rank then checks the step against the same model run in one process on the whole
// batch: the mean of the CP losses equals the single-device loss and the averaged gradients
// equal the single-device gradients. Exit code 1 when they do not.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <cpkit/optimized/optimized.hpp>

namespace {

constexpr int64_t kVocab = 50, kHidden = 16;

struct Model {
  at::Tensor embed, wq, wk, wv, head;  // [V, H], [H, H] x 3, [V, H]
  std::vector<at::Tensor> params() const { return {embed, wq, wk, wv, head}; }
};

Model make_model() {
  at::manual_seed(0);  // the same weights on every rank, as after a broadcast
  auto w = [](int64_t rows, int64_t cols) {
    return (at::randn({rows, cols}) / std::sqrt(static_cast<double>(cols))).requires_grad_(true);
  };
  return {w(kVocab, kHidden), w(kHidden, kHidden), w(kHidden, kHidden), w(kHidden, kHidden),
          w(kVocab, kHidden)};
}

// Four packed documents in one row (a THD microbatch): real lengths, slot lengths (slot
// padding after documents 1 and 3) and a row tail; no length divides by the CP size.
cpkit::CPBatch make_batch() {
  at::manual_seed(1);
  const std::vector<int64_t> lens = {37, 5, 0, 26}, slots = {39, 5, 1, 28};
  const int64_t T = 39 + 5 + 1 + 28 + 3;
  cpkit::CPBatch batch;
  batch.qkv_format = "thd";
  batch.input_ids = at::randint(1, kVocab, {1, T}, at::kLong);
  batch.labels = at::randint(0, kVocab, {1, T}, at::kLong);
  batch.seq_lens = at::tensor(lens, at::kLong).view({1, -1});
  batch.seq_lens_padded = at::tensor(slots, at::kLong).view({1, -1});
  return batch;
}

// The one-process truth: every query of the row against every key with the document-causal
// mask written out: doc(q) > 0, same document, earlier or equal position, key not padding
// (docs/spec.md section 3). Rows with no key give zeros.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& pos, const at::Tensor& doc, const at::Tensor& pad) {
  const at::Tensor allowed = (doc.unsqueeze(1) > 0) & (doc.unsqueeze(1) == doc.unsqueeze(0)) &
                             (pos.unsqueeze(0) <= pos.unsqueeze(1)) & (~pad).unsqueeze(0);
  const at::Tensor scores = at::matmul(q, k.t()) / std::sqrt(static_cast<double>(kHidden));
  const at::Tensor any = allowed.any(1, true);
  const at::Tensor probs = at::where(
      any, at::softmax(scores.masked_fill(~allowed, -INFINITY).masked_fill(~any, 0), 1), 0.0);
  return at::matmul(probs, v);
}

// The model on this rank's shard through cp_attention (`plan` set), or on the whole row with
// the mask written out (`plan` null, mesh nullptr): logits [1, L, V].
at::Tensor forward(const Model& m, const cpkit::LocalShard& s,
                   const std::shared_ptr<const cpkit::AttentionPlan>& plan,
                   const cpkit::MeshPtr& mesh) {
  const at::Tensor x = m.embed.index_select(0, s.input_ids.flatten());  // [L, H]
  const at::Tensor q = at::matmul(x, m.wq), k = at::matmul(x, m.wk), v = at::matmul(x, m.wv);
  const auto one_head = [](const at::Tensor& t) { return t.view({1, t.size(0), 1, kHidden}); };
  const at::Tensor attended =
      plan ? cpkit::cp_attention(one_head(q), one_head(k), one_head(v), plan, mesh)
                 .out.view({-1, kHidden})
           : masked_attention(q, k, v, s.position_ids.flatten(), s.document_ids.flatten(),
                              s.padding.flatten());
  const at::Tensor h = x + attended;
  // shifted_cp_loss takes contiguous float32 logits [B, L, V].
  return at::matmul(h, m.head.t()).unsqueeze(0).contiguous();
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

int main() {
  try {
    const cpkit::EnvMesh env = cpkit::make_mesh_from_env();  // CP group = the whole world
    const cpkit::MeshPtr& mesh = env.mesh;
    const int cp = env.cp_size;
    const cpkit::CPBatch batch = make_batch();
    const Model model = make_model();

    // The CP step on this rank's shard.
    const cpkit::Sharder sharder = cpkit::prepare_packed_cp_inputs(batch, mesh, /*num_chunks=*/1);
    const cpkit::LocalShard shard = sharder.local(0);
    const auto plan = std::make_shared<const cpkit::AttentionPlan>(
        cpkit::attention_plan(sharder, 0, env.cp_rank));  // no communication
    const at::Tensor loss =
        cpkit::shifted_cp_loss(forward(model, shard, plan, mesh), shard.labels, shard.valid, mesh);
    const auto grads = torch::autograd::grad({loss}, model.params());
    // The loss is scaled CP / N_global: averaging (not summing) over CP ranks, as FSDP and
    // DDP do, gives the single-device mean and its gradient.
    at::Tensor mean_loss = loss.detach().reshape({1}).clone();
    mesh->all_reduce_sum(mean_loss.data_ptr(), 1, cpkit::ScalarKind::kFloat32);
    mean_loss /= cp;
    std::vector<at::Tensor> averaged;
    for (const at::Tensor& g : grads) {
      at::Tensor sum = g.contiguous().clone();
      mesh->all_reduce_sum(sum.data_ptr(), static_cast<std::size_t>(sum.numel()),
                           cpkit::ScalarKind::kFloat32);
      averaged.push_back(sum / cp);
    }

    // The same model in one process on the whole row: CP = 1 (no mesh), plain LibTorch loss
    // (position t predicts label t + 1 where that label counts; mean over the targets).
    const cpkit::LocalShard whole = cpkit::prepare_packed_cp_inputs(batch, nullptr, 1).local(0);
    const at::Tensor logits = forward(model, whole, nullptr, nullptr).squeeze(0);
    const int64_t T = logits.size(0);
    const at::Tensor targets =
        at::where(whole.valid, whole.labels.flatten(), cpkit::kIgnoreLabel).narrow(0, 1, T - 1);
    const at::Tensor truth = at::cross_entropy_loss(logits.narrow(0, 0, T - 1), targets, {},
                                                    at::Reduction::Mean, cpkit::kIgnoreLabel);
    const auto truth_grads = torch::autograd::grad({truth}, model.params());

    const double loss_diff = std::abs(mean_loss.item<double>() - truth.item<double>());
    double grad_diff = 0;
    for (std::size_t i = 0; i < grads.size(); ++i)
      grad_diff = std::max(grad_diff, max_abs_diff(averaged[i], truth_grads[i]));
    const bool ok = loss_diff <= 1e-5 && grad_diff <= 1e-5;  // FP32; NaN fails both
    std::printf(
        "rank %d/%d: tokens [%lld, %lld), local loss %.6f, mean over CP %.6f, single device "
        "%.6f, |loss diff| %.2e, max |grad diff| %.2e: %s\n",
        env.cp_rank, cp, static_cast<long long>(shard.layout.fragments.front().begin),
        static_cast<long long>(shard.layout.fragments.back().end), loss.item<double>(),
        mean_loss.item<double>(), truth.item<double>(), loss_diff, grad_diff,
        ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_step: %s\n", e.what());
    return 2;
  }
}
