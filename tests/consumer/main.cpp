// Uses both installed libraries; exits non-zero if they disagree on a small packed batch.
#include <ATen/ATen.h>

#include <cpkit/optimized/loss.hpp>
#include <cpkit/optimized/sharder.hpp>
#include <cpkit/reference/reference.hpp>
#include <iostream>

int main() {
  cpkit::CPBatch batch;
  batch.qkv_format = "thd";
  batch.input_ids = at::arange(1, 11, at::kLong).unsqueeze(0);
  batch.labels = batch.input_ids.clone();
  batch.seq_lens = at::tensor(std::vector<int64_t>{3, 0, 4}, at::kLong).unsqueeze(0);
  batch.seq_lens_padded = at::tensor(std::vector<int64_t>{4, 1, 4}, at::kLong).unsqueeze(0);
  const cpkit::Sharder sharder = cpkit::prepare_packed_cp_inputs_for(batch, 3, 1);

  cpkit::reference::PackedBatch ref;
  ref.input_ids = cpkit::reference::IntMatrix(1, 10);
  for (int t = 0; t < 10; ++t) (*ref.input_ids)(0, t) = t + 1;
  ref.labels = *ref.input_ids;
  ref.seq_lens = cpkit::reference::IntMatrix{{3, 0, 4}};
  ref.seq_lens_padded = cpkit::reference::IntMatrix{{4, 1, 4}};
  const auto ref_sharder = cpkit::reference::prepare_packed_cp_inputs(ref, {.cp_size = 3});

  for (int r = 0; r < 3; ++r) {
    const at::Tensor docs = sharder.local(0, r).document_ids;
    const auto expected = ref_sharder.local(0, r).document_ids;
    for (int j = 0; j < docs.size(1); ++j)
      if (docs[0][j].item<int64_t>() != expected(0, j)) {
        std::cerr << "rank " << r << " token " << j << " differs\n";
        return 1;
      }
  }
  const at::Tensor logits = at::zeros({1, 4, 16});
  const auto shard = sharder.local(0, 0);
  const float loss =
      cpkit::shifted_cp_loss(logits, shard.labels, shard.valid, nullptr).item<float>();
  std::cout << "consumer: installed cpkit works, rank-0 loss " << loss << "\n";
  return 0;
}
