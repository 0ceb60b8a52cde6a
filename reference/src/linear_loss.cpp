// The LM head then the shifted loss, in double precision, materialising every logit.
#include "cpkit/reference/linear_loss.hpp"

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

std::vector<RankLinearLoss> shifted_cp_linear_loss(const std::vector<FloatMatrix>& hidden,
                                                   const FloatMatrix& weight,
                                                   const std::vector<IntMatrix>& labels,
                                                   const std::vector<BoolVector>& valid,
                                                   const LossOptions& options) {
  if (hidden.empty()) raise("hidden", "no ranks given");
  const Matrix<double> w = weight.cast<double>();
  std::vector<FloatMatrix> logits;
  for (std::size_t r = 0; r < hidden.size(); ++r) {
    if (hidden[r].cols() != weight.cols())
      raise("weight", "has H = ", weight.cols(), " but rank ", r,
            "'s hidden has H = ", hidden[r].cols());
    logits.push_back((hidden[r].cast<double>() * w.transpose()).cast<float>());
  }
  const std::vector<RankLoss> loss = shifted_cp_loss(logits, labels, valid, options);
  std::vector<RankLinearLoss> out(hidden.size());
  for (std::size_t r = 0; r < hidden.size(); ++r) {
    const Matrix<double> g = loss[r].grad_logits.cast<double>();  // d value / d logits
    out[r].value = loss[r].value;
    out[r].grad_hidden = (g * w).cast<float>();
    out[r].grad_weight = (g.transpose() * hidden[r].cast<double>()).cast<float>();
    out[r].local_targets = loss[r].local_targets;
    out[r].global_targets = loss[r].global_targets;
  }
  return out;
}

}  // namespace cpkit::reference
