// shifted_cp_loss (SPEC 5) and the single-device truth it must reproduce.
#pragma once

#include <optional>

#include "cpkit/reference/layout.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

struct LossOptions {
  // > 0: logits are raw and the loss applies c * tanh(z / c) (and its chain rule) first.
  // 0: logits already soft-capped by the model (the SPEC default).
  double softcap = 0.0;
  // Each rank's token positions (Layout::positions of every rank) when the shards were cut
  // by a layout other than "contiguous"; empty: contiguous.
  LayoutPositions layout = {};
};

// The target of one predicting position: a class id, or none.
using Target = std::optional<std::int64_t>;

// labels [B, L] and valid [B * L] of every rank: the same shape on each, labels in [0, vocab)
// or -100, no valid bit on a -100 label.
void check_shifted_labels(const std::vector<IntMatrix>& labels,
                          const std::vector<BoolVector>& valid, Eigen::Index vocab);

// Every rank's targets, [B * L] each (row-major): position j of row b predicts the counted
// label at the next global position (the next local one, the next rank's first at the
// boundary, or, with a layout, wherever that position lives); none past the sequence's end.
// labels and valid as for shifted_cp_loss, already checked.
std::vector<std::vector<Target>> shifted_targets(const std::vector<IntMatrix>& labels,
                                                 const std::vector<BoolVector>& valid,
                                                 const LayoutPositions& layout);

struct RankLoss {
  double value = 0.0;               // local_sum * CP / N, 0 when N == 0
  FloatMatrix grad_logits;          // d value / d logits, [B * L, V]
  std::int64_t local_targets = 0;   // counted targets on this rank
  std::int64_t global_targets = 0;  // N, summed over all ranks
};

// logits[r]: rank r's [B * L, V] (row-major [B, L, V]); labels[r]: [B, L] unshifted;
// valid[r]: [B * L], whether each label counts as a target. A rank's last position takes
// its target (label and valid bit) from rank r + 1's first column; the last rank's last
// position has none. With options.layout, every token takes the target of the token at the
// next global position, wherever it lives. The mean over ranks of value equals the single-device
// mean.
std::vector<RankLoss> shifted_cp_loss(const std::vector<FloatMatrix>& logits,
                                      const std::vector<IntMatrix>& labels,
                                      const std::vector<BoolVector>& valid,
                                      const LossOptions& options = {});

struct MeanLoss {
  double value = 0.0;       // mean CE over targets, 0 when there are none
  FloatMatrix grad_logits;  // d value / d logits, [B * S, V]
  std::int64_t targets = 0;
};

// HF causal-LM loss on the whole unsharded batch: logits [B * S, V], labels [B, S];
// position t of a row predicts labels[t + 1]; -100 is ignored; mean over targets.
MeanLoss single_device_shifted_loss(const FloatMatrix& logits, const IntMatrix& labels,
                                    const LossOptions& options = {});

}  // namespace cpkit::reference
