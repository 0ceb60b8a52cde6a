// Per-position log-probability and entropy in double precision, materialising every logit.
#include "cpkit/reference/token_logprobs.hpp"

#include <cmath>

#include "cpkit/reference/error.hpp"
#include "cpkit/reference/loss.hpp"

namespace cpkit::reference {

std::vector<RankTokenLogprobs> token_logprobs(const std::vector<FloatMatrix>& hidden,
                                              const FloatMatrix& weight,
                                              const std::vector<IntMatrix>& labels,
                                              const std::vector<BoolVector>& valid,
                                              const std::vector<std::vector<double>>& grad_logprobs,
                                              const std::vector<std::vector<double>>& grad_entropy,
                                              const TokenLogprobsOptions& options) {
  const auto cp = hidden.size();
  if (cp == 0) raise("hidden", "no ranks given");
  if (labels.size() != cp || valid.size() != cp || grad_logprobs.size() != cp ||
      grad_entropy.size() != cp)
    raise("labels", "hidden/labels/valid/upstreams cover ", cp, "/", labels.size(), "/",
          valid.size(), "/", grad_logprobs.size(), "/", grad_entropy.size(), " ranks");
  if (!(options.softcap >= 0.0) || !std::isfinite(options.softcap))
    raise("softcap", "must be finite and >= 0 (0: off), got ", options.softcap);
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature))
    raise("temperature", "must be finite and > 0, got ", options.temperature);
  const auto V = weight.rows(), H = weight.cols();
  if (V < 2) raise("weight", "vocabulary size must be >= 2, got ", V);
  check_shifted_labels(labels, valid, V);
  const auto positions = labels[0].size();
  for (std::size_t r = 0; r < cp; ++r)
    if (hidden[r].rows() != positions || hidden[r].cols() != H ||
        static_cast<Eigen::Index>(grad_logprobs[r].size()) != positions ||
        static_cast<Eigen::Index>(grad_entropy[r].size()) != positions)
      raise("hidden", "rank ", r, ": hidden [", hidden[r].rows(), ", ", hidden[r].cols(),
            "] and upstreams of ", grad_logprobs[r].size(), "/", grad_entropy[r].size(),
            " positions, but B * L = ", positions, " and H = ", H);
  const std::vector<std::vector<Target>> targets = shifted_targets(labels, valid, options.layout);
  const Matrix<double> w = weight.cast<double>();
  const double c = options.softcap, t = options.temperature;
  std::vector<RankTokenLogprobs> out(cp);
  for (std::size_t r = 0; r < cp; ++r) {
    RankTokenLogprobs& o = out[r];
    const Matrix<double> h = hidden[r].cast<double>();
    const Matrix<double> y = h * w.transpose();  // raw head outputs [B * L, V]
    Matrix<double> dy = Matrix<double>::Zero(positions, V);
    o.logprobs.assign(static_cast<std::size_t>(positions), 0.0);
    o.entropy.assign(static_cast<std::size_t>(positions), 0.0);
    o.has_target.assign(static_cast<std::size_t>(positions), false);
    for (Eigen::Index i = 0; i < positions; ++i) {
      const Target& target = targets[r][static_cast<std::size_t>(i)];
      if (!target) continue;
      std::vector<double> z(static_cast<std::size_t>(V));
      for (Eigen::Index k = 0; k < V; ++k)
        z[k] = (c > 0 ? c * std::tanh(y(i, k) / c) : y(i, k)) / t;
      double max_z = z[0];
      for (double v : z) max_z = std::max(max_z, v);
      double total = 0.0;
      for (double v : z) total += std::exp(v - max_z);
      const double lse = max_z + std::log(total);
      double mean_z = 0.0;
      for (double v : z) mean_z += std::exp(v - lse) * v;
      const auto at = static_cast<std::size_t>(i);
      o.has_target[at] = true;
      o.logprobs[at] = z[*target] - lse;
      o.entropy[at] = lse - mean_z;
      const double g_lp = grad_logprobs[r][at], g_ent = grad_entropy[r][at];
      for (Eigen::Index k = 0; k < V; ++k) {
        const double p = std::exp(z[k] - lse);
        const double dz = g_lp * ((k == *target ? 1.0 : 0.0) - p) - g_ent * p * (z[k] - mean_z);
        const double th = c > 0 ? std::tanh(y(i, k) / c) : 0.0;
        dy(i, k) = dz / t * (c > 0 ? 1.0 - th * th : 1.0);
      }
    }
    o.grad_hidden = (dy * w).cast<float>();
    o.grad_weight = (dy.transpose() * h).cast<float>();
  }
  return out;
}

}  // namespace cpkit::reference
