// policy_loss in double, materialising every logit: log-probabilities and entropies per
// position, then the RL terms, the aggregation weights counted over every rank, and each
// position's derivative of J written out from the formulas of docs/spec.md section 5c.
#include "cpkit/reference/policy_loss.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "cpkit/reference/error.hpp"
#include "cpkit/reference/loss.hpp"

namespace cpkit::reference {

namespace {

struct Position {
  bool counts = false;
  std::int64_t target = 0;
  double lp = 0, entropy = 0, mean_z = 0;
  std::vector<double> y, z, p;  // raw head outputs, capped and tempered logits, softmax
};

struct Sequence {
  double count = 0, delta_sum = 0, coef = 0;  // coef: sum of w dl/dR over its positions
};

using SeqKey = std::tuple<std::size_t, Eigen::Index, std::int64_t>;  // (DP rank, row, id)

void check_options(const PolicyLossOptions& o, std::size_t ranks) {
  if (o.kind != "ppo" && o.kind != "cispo" && o.kind != "gspo")
    raise("kind", "must be ppo, cispo or gspo, got \"", o.kind, "\"");
  if (o.kl != "k1" && o.kl != "k2" && o.kl != "k3")
    raise("kl", "must be k1, k2 or k3, got \"", o.kl, "\"");
  if (o.aggregation != "token_mean" && o.aggregation != "seq_mean_token_mean" &&
      o.aggregation != "seq_mean_token_sum" && o.aggregation != "constant")
    raise("aggregation",
          "must be token_mean, seq_mean_token_mean, seq_mean_token_sum or constant, got \"",
          o.aggregation, "\"");
  if (!(o.eps_low >= 0 && o.eps_low < 1)) raise("eps_low", "must be in [0, 1), got ", o.eps_low);
  if (!(o.eps_high >= 0) || !std::isfinite(o.eps_high))
    raise("eps_high", "must be finite and >= 0, got ", o.eps_high);
  if (!(o.dual_clip == 0 || o.dual_clip > 1) || !std::isfinite(o.dual_clip))
    raise("dual_clip", "must be 0 (off) or > 1, got ", o.dual_clip);
  for (const auto& [value, name] :
       {std::pair{o.kl_coef, "kl_coef"}, {o.tis_cap, "tis_cap"}, {o.entropy_coef, "entropy_coef"}})
    if (!(value >= 0) || !std::isfinite(value)) raise(name, "must be finite and >= 0, got ", value);
  if (o.aggregation == "constant" && !(o.divisor > 0 && std::isfinite(o.divisor)))
    raise("divisor", "must be finite and > 0 with the constant aggregation, got ", o.divisor);
  if (o.cp < 1 || ranks == 0 || ranks % static_cast<std::size_t>(o.cp) != 0)
    raise("ranks", ranks, " ranks do not make whole CP groups of ", o.cp);
}

double clip(double r, const PolicyLossOptions& o) {
  return std::clamp(r, 1.0 - o.eps_low, 1.0 + o.eps_high);
}

// The clipped surrogate max(-A r, -A clip(r)) (and the dual clip): its value, d / d r, and
// whether a clip chose a constant.
struct Surrogate {
  double value, slope;
  bool clipped;
};

Surrogate surrogate(double a, double r, const PolicyLossOptions& o) {
  const double plain = -a * r, clipped = -a * clip(r, o);
  Surrogate s{std::max(plain, clipped), plain >= clipped ? -a : 0.0, clipped > plain};
  if (o.dual_clip > 1 && a < 0 && -o.dual_clip * a < s.value) s = {-o.dual_clip * a, 0.0, true};
  return s;
}

}  // namespace

std::vector<RankPolicyLoss> policy_loss(const std::vector<PolicyRankInputs>& ranks,
                                        const FloatMatrix& weight, const PolicyLossOptions& o) {
  check_options(o, ranks.size());
  const std::size_t n = ranks.size(), cp = static_cast<std::size_t>(o.cp);
  const Eigen::Index V = weight.rows(), H = weight.cols();
  if (V < 2) raise("weight", "vocabulary size must be >= 2, got ", V);
  const bool gspo = o.kind == "gspo";
  const bool by_sequence = gspo || o.aggregation.rfind("seq_", 0) == 0;
  // Targets, one CP group at a time.
  std::vector<std::vector<Target>> targets(n);
  for (std::size_t d = 0; d < n / cp; ++d) {
    std::vector<IntMatrix> labels;
    std::vector<BoolVector> valid;
    for (std::size_t c = 0; c < cp; ++c) {
      labels.push_back(ranks[d * cp + c].labels);
      valid.push_back(ranks[d * cp + c].valid);
    }
    check_shifted_labels(labels, valid, V);
    const auto group = shifted_targets(labels, valid, o.layout);
    for (std::size_t c = 0; c < cp; ++c) targets[d * cp + c] = group[c];
  }
  // Every position's logits, softmax, log-probability and entropy.
  const Matrix<double> w = weight.cast<double>();
  std::vector<std::vector<Position>> at(n);
  for (std::size_t r = 0; r < n; ++r) {
    const PolicyRankInputs& in = ranks[r];
    const Eigen::Index positions = in.labels.size();
    if (in.hidden.rows() != positions || in.hidden.cols() != H)
      raise("hidden", "rank ", r, ": [", in.hidden.rows(), ", ", in.hidden.cols(),
            "] but B * L = ", positions, " and H = ", H);
    const auto need = [&](const std::vector<double>& v, const char* name, bool required) {
      if (!required && v.empty()) return;
      if (static_cast<Eigen::Index>(v.size()) != positions)
        raise(name, "rank ", r, ": ", v.size(), " values for B * L = ", positions, " positions");
    };
    need(in.advantages, "advantages", true);
    need(in.old_logprobs, "old_logprobs", true);
    need(in.ref_logprobs, "ref_logprobs", o.kl_coef > 0);
    need(in.sampler_logprobs, "sampler_logprobs", o.tis_cap > 0);
    if (by_sequence && static_cast<Eigen::Index>(in.sequence_ids.size()) != positions)
      raise("sequence_ids", "rank ", r, ": ", in.sequence_ids.size(),
            " ids for B * L = ", positions, " positions (the ", o.kind, " kind and the ",
            o.aggregation, " aggregation need them)");
    const Matrix<double> y = in.hidden.cast<double>() * w.transpose();
    at[r].resize(static_cast<std::size_t>(positions));
    for (Eigen::Index i = 0; i < positions; ++i) {
      const Target& t = targets[r][static_cast<std::size_t>(i)];
      if (!t) continue;
      Position& p = at[r][static_cast<std::size_t>(i)];
      p.counts = true;
      p.target = *t;
      for (Eigen::Index k = 0; k < V; ++k) {
        p.y.push_back(y(i, k));
        const double capped = o.softcap > 0 ? o.softcap * std::tanh(y(i, k) / o.softcap) : y(i, k);
        p.z.push_back(capped / o.temperature);
      }
      const double top = *std::max_element(p.z.begin(), p.z.end());
      double total = 0;
      for (const double v : p.z) total += std::exp(v - top);
      const double lse = top + std::log(total);
      for (const double v : p.z) {
        p.p.push_back(std::exp(v - lse));
        p.mean_z += p.p.back() * v;
      }
      p.lp = p.z[static_cast<std::size_t>(*t)] - lse;
      p.entropy = lse - p.mean_z;
      const auto check = [&](const std::vector<double>& v, const char* name) {
        if (!v.empty() && !std::isfinite(v[static_cast<std::size_t>(i)]))
          raise(name, "rank ", r, " position ", i, " counts but is ",
                v[static_cast<std::size_t>(i)]);
      };
      check(in.advantages, "advantages");
      check(in.old_logprobs, "old_logprobs");
      if (o.kl_coef > 0) check(in.ref_logprobs, "ref_logprobs");
      if (o.tis_cap > 0) check(in.sampler_logprobs, "sampler_logprobs");
    }
  }
  // Counts over the whole group: positions, and each sequence's positions and log-ratio sum.
  double N = 0;
  std::map<SeqKey, Sequence> sequences;
  auto key_of = [&](std::size_t r, Eigen::Index i) {
    const PolicyRankInputs& in = ranks[r];
    const std::int64_t id = in.sequence_ids[static_cast<std::size_t>(i)];
    if (id <= 0) raise("sequence_ids", "rank ", r, " position ", i, " counts but has id ", id);
    return SeqKey{r / cp, i / in.labels.cols(), id};
  };
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < at[r].size(); ++i) {
      const Position& p = at[r][i];
      if (!p.counts) continue;
      N += 1;
      if (!by_sequence) continue;
      Sequence& s = sequences[key_of(r, static_cast<Eigen::Index>(i))];
      s.count += 1;
      s.delta_sum += p.lp - ranks[r].old_logprobs[i];
    }
  const double G = static_cast<double>(sequences.size()), W = static_cast<double>(n);
  auto weight_of = [&](std::size_t r, std::size_t i) {
    if (o.aggregation == "token_mean") return 1.0 / N;
    if (o.aggregation == "constant") return 1.0 / o.divisor;
    const Sequence& s = sequences.at(key_of(r, static_cast<Eigen::Index>(i)));
    return o.aggregation == "seq_mean_token_sum" ? 1.0 / G : 1.0 / (G * s.count);
  };
  // Terms and each position's d J / d lp and d J / d entropy (the sequence part comes after).
  std::vector<RankPolicyLoss> out(n);
  std::vector<std::vector<double>> g_lp(n), g_ent(n);
  for (std::size_t r = 0; r < n; ++r) {
    const PolicyRankInputs& in = ranks[r];
    const std::size_t positions = at[r].size();
    RankPolicyLoss& res = out[r];
    for (auto* v : {&res.logprobs, &res.ratio, &res.clipped, &res.kl, &res.entropy})
      v->assign(positions, 0.0);
    g_lp[r].assign(positions, 0.0);
    g_ent[r].assign(positions, 0.0);
    for (std::size_t i = 0; i < positions; ++i) {
      const Position& p = at[r][i];
      if (!p.counts) continue;
      const double a = in.advantages[i], wt = weight_of(r, i);
      const double tis =
          o.tis_cap > 0 ? std::min(std::exp(in.old_logprobs[i] - in.sampler_logprobs[i]), o.tis_cap)
                        : 1.0;
      double pg = 0, dpg_dlp = 0, ratio = std::exp(p.lp - in.old_logprobs[i]);
      bool clipped = false;
      if (o.kind == "ppo") {
        const Surrogate s = surrogate(a, ratio, o);
        pg = s.value;
        dpg_dlp = s.slope * ratio;
        clipped = s.clipped;
      } else if (o.kind == "cispo") {
        const double c = clip(ratio, o);
        pg = -c * a * p.lp;
        dpg_dlp = -c * a;
        clipped = c != ratio;
      } else {
        Sequence& seq = sequences.at(key_of(r, static_cast<Eigen::Index>(i)));
        ratio = std::exp(seq.delta_sum / seq.count);
        const Surrogate s = surrogate(a, ratio, o);
        pg = s.value;
        clipped = s.clipped;
        seq.coef += wt * tis * s.slope;  // d J / d R_i, gathered over the sequence
      }
      double kl = 0, dkl_dlp = 0;
      if (o.kl_coef > 0) {
        const double dlt = in.ref_logprobs[i] - p.lp;
        if (o.kl == "k1") {
          kl = -dlt;
          dkl_dlp = 1;
        } else if (o.kl == "k2") {
          kl = dlt * dlt / 2;
          dkl_dlp = -dlt;
        } else {
          kl = std::exp(dlt) - dlt - 1;
          dkl_dlp = 1 - std::exp(dlt);
        }
      }
      const double l = tis * pg + o.kl_coef * kl - o.entropy_coef * p.entropy;
      res.loss += W * wt * l;
      res.logprobs[i] = p.lp;
      res.ratio[i] = ratio;
      res.clipped[i] = clipped ? 1.0 : 0.0;
      res.kl[i] = kl;
      res.entropy[i] = p.entropy;
      g_lp[r][i] = wt * (tis * dpg_dlp + o.kl_coef * dkl_dlp);
      g_ent[r][i] = -wt * o.entropy_coef;
    }
  }
  if (gspo)  // d R_i / d lp_j = R_i / n_i for each counted position j of sequence i
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < at[r].size(); ++i)
        if (at[r][i].counts) {
          const Sequence& s = sequences.at(key_of(r, static_cast<Eigen::Index>(i)));
          g_lp[r][i] += s.coef * std::exp(s.delta_sum / s.count) / s.count;
        }
  // The chain rule through log-softmax, entropy, temperature and cap, then the head.
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < at[r].size(); ++i) {
      out[r].grad_logprobs.push_back(W * g_lp[r][i]);
      out[r].grad_entropy.push_back(W * g_ent[r][i]);
    }
    const Eigen::Index positions = static_cast<Eigen::Index>(at[r].size());
    Matrix<double> dy = Matrix<double>::Zero(positions, V);
    for (Eigen::Index i = 0; i < positions; ++i) {
      const Position& p = at[r][static_cast<std::size_t>(i)];
      if (!p.counts) continue;
      const double gl = g_lp[r][static_cast<std::size_t>(i)],
                   ge = g_ent[r][static_cast<std::size_t>(i)];
      for (Eigen::Index k = 0; k < V; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        const double dz =
            gl * ((k == p.target ? 1.0 : 0.0) - p.p[kk]) - ge * p.p[kk] * (p.z[kk] - p.mean_z);
        const double th = o.softcap > 0 ? std::tanh(p.y[kk] / o.softcap) : 0.0;
        dy(i, k) = W * dz / o.temperature * (o.softcap > 0 ? 1.0 - th * th : 1.0);
      }
    }
    out[r].grad_hidden = (dy * w).cast<float>();
    out[r].grad_weight = (dy.transpose() * ranks[r].hidden.cast<double>()).cast<float>();
  }
  return out;
}

}  // namespace cpkit::reference
