// cpkit-demo: runs the embedded default packed batch (or one given by flags) through the
// reference and checks the CP loss against the single-device loss.
#include <cmath>
#include <iostream>
#include <random>

#include "demo.hpp"

namespace cpkit::demo {

reference::PackedBatch make_demo_batch(const DemoOptions& o) {
  const auto D = static_cast<Eigen::Index>(o.doc_lens.size());
  reference::PackedBatch batch;
  batch.seq_lens.resize(1, D);
  batch.seq_lens_padded.resize(1, D);
  std::int64_t slots = 0;
  for (Eigen::Index d = 0; d < D; ++d) {
    const auto len = o.doc_lens[static_cast<std::size_t>(d)];
    batch.seq_lens(0, d) = len;
    batch.seq_lens_padded(0, d) = (len + o.slot_multiple - 1) / o.slot_multiple * o.slot_multiple;
    slots += batch.seq_lens_padded(0, d);
  }
  const std::int64_t T = std::max<std::int64_t>(1, slots + o.tail);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int64_t> id(1, o.vocab - 1);
  batch.input_ids = reference::IntMatrix(1, T);
  for (std::int64_t t = 0; t < T; ++t) (*batch.input_ids)(0, t) = id(rng);
  batch.labels = *batch.input_ids;  // causal LM: labels are the ids, the loss shifts them
  return batch;
}

reference::FloatMatrix make_demo_logits(const DemoOptions& o, Eigen::Index padded_len) {
  std::mt19937_64 rng(o.seed + 1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  reference::FloatMatrix logits(padded_len, o.vocab);
  for (Eigen::Index i = 0; i < logits.size(); ++i) logits.data()[i] = normal(rng);
  return logits;
}

DemoResult run_reference(const DemoOptions& o) {
  using namespace reference;
  const PackedBatch batch = make_demo_batch(o);
  const Sharder sharder = prepare_packed_cp_inputs(
      batch, {.cp_size = o.cp, .layout = o.layout, .balance_slack = o.balance_slack});
  const GlobalStreams& g = sharder.global(0);
  const FloatMatrix logits = make_demo_logits(o, g.padded_len);

  DemoResult result;
  std::vector<FloatMatrix> local_logits;
  std::vector<IntMatrix> labels;
  std::vector<BoolVector> valid;
  for (int r = 0; r < o.cp; ++r) {
    result.shards.push_back(sharder.local(0, r));
    const auto& positions = result.shards.back().layout.positions;
    local_logits.push_back(logits(positions, Eigen::all));  // the rank's tokens, in local order
    labels.push_back(result.shards.back().labels);
    valid.push_back(result.shards.back().valid);
  }
  // A layout other than contiguous: each token's target is the next global position's.
  LossOptions loss_options;
  if (o.layout != "contiguous") loss_options.layout = g.owned;
  result.losses = shifted_cp_loss(local_logits, labels, valid, loss_options);
  for (const auto& loss : result.losses) result.combined += loss.value / o.cp;

  // Single device: HF labels for a packed row (-100 on padding and each document's first
  // token), over the unpadded row.
  IntMatrix truth = g.labels.leftCols(g.seq_len);
  for (Eigen::Index t = 0; t < g.seq_len; ++t)
    if (!g.valid(0, t)) truth(0, t) = kIgnoreLabel;
  result.single_device = single_device_shifted_loss(logits.topRows(g.seq_len), truth).value;
  return result;
}

}  // namespace cpkit::demo

int main(int argc, char** argv) {
  using namespace cpkit::demo;
  try {
    const DemoOptions options = parse_options(argc, argv);
    if (options.help) {
      print_help(std::cout);
      return 0;
    }
    if (options.launcher == "env") return run_launched(options, std::cout) ? 0 : 1;
    const DemoResult result =
        options.impl == "optimized" ? run_optimized(options) : run_reference(options);
    print_report(options, make_demo_batch(options), result, std::cout);
    bool ok = true;
    if (options.impl == "optimized") {
      std::cout << "\noptimized vs reference:\n";
      ok = same_result(result, run_reference(options), std::cout);
    }
    // The reference works in double; the optimized path in FP32 (docs/spec.md, tolerances).
    const double tolerance =
        (options.impl == "optimized" ? 1e-5 : 1e-9) * (1 + std::abs(result.single_device));
    if (!(std::abs(result.combined - result.single_device) <= tolerance)) {
      std::cerr << "cpkit-demo: CP loss differs from the single-device loss by more than "
                << tolerance << "\n";
      return 1;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "cpkit-demo: " << e.what() << "\n";
    return 2;
  }
}
