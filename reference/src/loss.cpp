// Shifted cross-entropy in double precision: the CP form and the single-device truth.
#include "cpkit/reference/loss.hpp"

#include <cmath>
#include <optional>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

// Adds d(scale * CE)/d logits into `grad` and returns CE for one row of V logits.
double cross_entropy_row(const float* logits, Eigen::Index vocab, std::int64_t target,
                         double softcap, double scale, float* grad) {
  std::vector<double> z(static_cast<std::size_t>(vocab));
  for (Eigen::Index i = 0; i < vocab; ++i)
    z[i] = softcap > 0 ? softcap * std::tanh(logits[i] / softcap) : logits[i];
  double max_z = z[0];
  for (double value : z) max_z = std::max(max_z, value);
  double total = 0.0;
  for (double value : z) total += std::exp(value - max_z);
  const double log_sum = max_z + std::log(total);
  for (Eigen::Index i = 0; i < vocab; ++i) {
    const double softmax = std::exp(z[i] - log_sum);
    double d = (softmax - (i == target ? 1.0 : 0.0)) * scale;
    if (softcap > 0) {
      const double t = std::tanh(logits[i] / softcap);
      d *= 1.0 - t * t;  // chain rule through c * tanh(z / c)
    }
    grad[i] = static_cast<float>(d);
  }
  return log_sum - z[target];
}

void check_label_range(const IntMatrix& labels, Eigen::Index vocab, const char* where) {
  for (Eigen::Index b = 0; b < labels.rows(); ++b)
    for (Eigen::Index t = 0; t < labels.cols(); ++t) {
      const auto label = labels(b, t);
      if (label != kIgnoreLabel && (label < 0 || label >= vocab))
        raise("labels", "value ", label, " at [", b, ", ", t, "]", where,
              " is outside the vocabulary [0, ", vocab, ") and not -100");
    }
}

// 0 (off) or a finite positive cap; anything else means nothing.
void check_softcap(double softcap) {
  if (!(softcap >= 0.0) || !std::isfinite(softcap))
    raise("softcap", "must be finite and >= 0 (0: off), got ", softcap);
}

void check_vocab(Eigen::Index vocab) {
  if (vocab < 2) raise("logits", "vocabulary size must be >= 2, got ", vocab);
}

// Loss sum and gradient (scaled by `scale`) over rows whose target is set.
double loss_sum(const FloatMatrix& logits, const std::vector<Target>& targets, double softcap,
                double scale, FloatMatrix& grad) {
  grad = FloatMatrix::Zero(logits.rows(), logits.cols());
  double sum = 0.0;
  for (Eigen::Index row = 0; row < logits.rows(); ++row)
    if (targets[static_cast<std::size_t>(row)])
      sum += cross_entropy_row(logits.row(row).data(), logits.cols(),
                               *targets[static_cast<std::size_t>(row)], softcap, scale,
                               grad.row(row).data());
  return sum;
}

// Under a layout: put every rank's labels and valid bits at their global positions, then each
// token's target is the counted label at the next global position.
std::vector<std::vector<Target>> layout_targets(const std::vector<IntMatrix>& labels,
                                                const std::vector<BoolVector>& valid,
                                                const LayoutPositions& layout) {
  const auto cp = labels.size();
  const auto B = labels[0].rows(), L = labels[0].cols();
  if (layout.size() != cp) raise("layout", "covers ", layout.size(), " ranks, not ", cp);
  const auto T = static_cast<Eigen::Index>(cp) * L;  // S_pad
  std::vector<Target> global(static_cast<std::size_t>(B * T));
  for (std::size_t r = 0; r < cp; ++r) {
    if (static_cast<Eigen::Index>(layout[r].size()) != L)
      raise("layout", "rank ", r, " has ", layout[r].size(), " positions but L = ", L);
    for (Eigen::Index b = 0; b < B; ++b)
      for (Eigen::Index j = 0; j < L; ++j)
        if (valid[r](b * L + j))
          global[static_cast<std::size_t>(b * T + layout[r][static_cast<std::size_t>(j)])] =
              labels[r](b, j);
  }
  std::vector<std::vector<Target>> targets(cp);
  for (std::size_t r = 0; r < cp; ++r)
    for (Eigen::Index b = 0; b < B; ++b)
      for (Eigen::Index j = 0; j < L; ++j) {
        const auto next = layout[r][static_cast<std::size_t>(j)] + 1;
        targets[r].push_back(next < T ? global[static_cast<std::size_t>(b * T + next)] : Target());
      }
  return targets;
}

}  // namespace

void check_shifted_labels(const std::vector<IntMatrix>& labels,
                          const std::vector<BoolVector>& valid, Eigen::Index vocab) {
  const auto B = labels[0].rows();
  const auto L = labels[0].cols();
  for (std::size_t r = 0; r < labels.size(); ++r) {
    if (labels[r].rows() != B || labels[r].cols() != L)
      raise("labels", "rank ", r, " has shape [", labels[r].rows(), ", ", labels[r].cols(),
            "] but rank 0 has [", B, ", ", L, "]");
    if (valid[r].size() != B * L)
      raise("valid", "rank ", r, " has ", valid[r].size(), " entries but B * L = ", B * L);
    const std::string where = " of rank " + std::to_string(r);
    check_label_range(labels[r], vocab, where.c_str());
    for (Eigen::Index i = 0; i < B * L; ++i)
      if (valid[r](i) && labels[r](i / L, i % L) == kIgnoreLabel)
        raise("valid", "rank ", r, " marks token ", i, " valid but its label is -100");
  }
}

std::vector<std::vector<Target>> shifted_targets(const std::vector<IntMatrix>& labels,
                                                 const std::vector<BoolVector>& valid,
                                                 const LayoutPositions& layout) {
  if (!layout.empty()) return layout_targets(labels, valid, layout);
  // Local label j + 1, or the next rank's first label at the boundary.
  const auto cp = labels.size();
  const auto B = labels[0].rows(), L = labels[0].cols();
  std::vector<std::vector<Target>> targets(cp);
  for (std::size_t r = 0; r < cp; ++r)
    for (Eigen::Index b = 0; b < B; ++b)
      for (Eigen::Index j = 0; j < L; ++j) {
        Target target;
        if (j + 1 < L) {
          if (valid[r](b * L + j + 1)) target = labels[r](b, j + 1);
        } else if (r + 1 < cp) {
          if (valid[r + 1](b * L)) target = labels[r + 1](b, 0);
        }
        targets[r].push_back(target);
      }
  return targets;
}

std::vector<RankLoss> shifted_cp_loss(const std::vector<FloatMatrix>& logits,
                                      const std::vector<IntMatrix>& labels,
                                      const std::vector<BoolVector>& valid,
                                      const LossOptions& options) {
  const auto cp = logits.size();
  if (cp == 0) raise("logits", "no ranks given");
  if (labels.size() != cp || valid.size() != cp)
    raise("labels", "logits/labels/valid cover ", cp, "/", labels.size(), "/", valid.size(),
          " ranks");
  const auto B = labels[0].rows();
  const auto L = labels[0].cols();
  const auto V = logits[0].cols();
  check_vocab(V);
  check_softcap(options.softcap);
  check_shifted_labels(labels, valid, V);
  for (std::size_t r = 0; r < cp; ++r)
    if (logits[r].rows() != B * L || logits[r].cols() != V)
      raise("logits", "rank ", r, " has shape [", logits[r].rows(), ", ", logits[r].cols(),
            "] but [B * L, V] = [", B * L, ", ", V, "] is required");

  const std::vector<std::vector<Target>> targets = shifted_targets(labels, valid, options.layout);
  std::int64_t global_targets = 0;
  for (const auto& rank_targets : targets)
    for (const auto& t : rank_targets) global_targets += t ? 1 : 0;

  std::vector<RankLoss> out(cp);
  const double scale = global_targets > 0 ? static_cast<double>(cp) / global_targets : 0.0;
  for (std::size_t r = 0; r < cp; ++r) {
    out[r].global_targets = global_targets;
    for (const auto& t : targets[r]) out[r].local_targets += t ? 1 : 0;
    out[r].value =
        loss_sum(logits[r], targets[r], options.softcap, scale, out[r].grad_logits) * scale;
  }
  return out;
}

MeanLoss single_device_shifted_loss(const FloatMatrix& logits, const IntMatrix& labels,
                                    const LossOptions& options) {
  const auto B = labels.rows();
  const auto S = labels.cols();
  check_vocab(logits.cols());
  if (logits.rows() != B * S) raise("logits", "has ", logits.rows(), " rows but B * S = ", B * S);
  check_label_range(labels, logits.cols(), "");
  std::vector<Target> targets;
  MeanLoss out;
  for (Eigen::Index b = 0; b < B; ++b)
    for (Eigen::Index t = 0; t < S; ++t) {
      Target target;
      if (t + 1 < S && labels(b, t + 1) != kIgnoreLabel) target = labels(b, t + 1);
      targets.push_back(target);
      if (target) ++out.targets;
    }
  const double scale = out.targets > 0 ? 1.0 / static_cast<double>(out.targets) : 0.0;
  out.value = loss_sum(logits, targets, options.softcap, scale, out.grad_logits) * scale;
  return out;
}

}  // namespace cpkit::reference
