// shifted_cp_linear_loss (SPEC 5a) written the simple way: the full logits hidden * weight^T,
// then shifted_cp_loss and the chain rule through the head.
#pragma once

#include "cpkit/reference/loss.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

struct RankLinearLoss {
  double value = 0.0;       // as RankLoss::value
  FloatMatrix grad_hidden;  // d value / d hidden, [B * L, H]
  FloatMatrix grad_weight;  // d value / d weight, [V, H]: this rank's loss only
  std::int64_t local_targets = 0;
  std::int64_t global_targets = 0;
};

// hidden[r]: rank r's [B * L, H] (row-major [B, L, H]); weight: the head [V, H], the same on
// every rank; labels and valid as for shifted_cp_loss.
std::vector<RankLinearLoss> shifted_cp_linear_loss(const std::vector<FloatMatrix>& hidden,
                                                   const FloatMatrix& weight,
                                                   const std::vector<IntMatrix>& labels,
                                                   const std::vector<BoolVector>& valid,
                                                   const LossOptions& options = {});

}  // namespace cpkit::reference
