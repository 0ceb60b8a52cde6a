// CP attention in double, written as the textbook formulas over every key of the row.
#include "cpkit/reference/cp_attention.hpp"

#include <cmath>
#include <optional>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

using DoubleMatrix = Matrix<double>;

void check_heads(const std::vector<RankHeads>& ranks, const AttentionOptions& o) {
  if (ranks.empty()) raise("ranks", "is empty");
  const std::size_t hq = ranks[0].q.size(), hkv = ranks[0].k.size();
  if (hkv == 0 || hq == 0 || hq % hkv != 0)
    raise("q", "has ", hq, " heads, not a positive multiple of k's ", hkv);
  if (!o.sinks.empty() && o.sinks.size() != hq)
    raise("sinks", "has ", o.sinks.size(), " entries but there are ", hq, " query heads");
  if (o.window < 0) raise("window", "must be >= 0, got ", o.window);
  if (!(o.softcap >= 0)) raise("softcap", "must be >= 0, got ", o.softcap);
  if (!(o.scale >= 0)) raise("scale", "must be >= 0 (0: 1 / sqrt(D)), got ", o.scale);
  const Eigen::Index d = ranks[0].q[0].cols();
  for (const RankHeads& r : ranks) {
    if (r.q.size() != hq || r.k.size() != hkv || r.v.size() != hkv)
      raise("ranks", "hold different head counts");
    const Eigen::Index n = r.meta.position.size();
    for (const auto* heads : {&r.q, &r.k, &r.v})
      for (const FloatMatrix& m : *heads)
        if (m.rows() != n || m.cols() != d)
          raise("q", "every head must be [", n, ", ", d, "], got [", m.rows(), ", ", m.cols(), "]");
  }
}

// Every rank's keys (or values) of one head, in rank order.
FloatMatrix row_of(const std::vector<RankHeads>& ranks, std::vector<FloatMatrix> RankHeads::*part,
                   std::size_t head) {
  Eigen::Index total = 0;
  for (const RankHeads& r : ranks) total += (r.*part)[head].rows();
  FloatMatrix all(total, ranks[0].q[0].cols());
  Eigen::Index at = 0;
  for (const RankHeads& r : ranks) {
    all.middleRows(at, (r.*part)[head].rows()) = (r.*part)[head];
    at += (r.*part)[head].rows();
  }
  return all;
}

TokenMeta row_meta(const std::vector<RankHeads>& ranks) {
  std::vector<TokenMeta> metas;
  for (const RankHeads& r : ranks) metas.push_back(r.meta);
  return concatenate_meta(metas);
}

// One query head's softmax over the row's keys: s the scaled scores before the cap, p the
// probabilities of visible keys, sink the sink's share, lse the log of the denominator.
struct Softmax {
  DoubleMatrix s, p;
  Vector<double> sink, lse;
};

Softmax softmax(const FloatMatrix& q, const FloatMatrix& k, const TokenMeta& qm,
                const TokenMeta& km, const AttentionOptions& o, std::optional<double> sink) {
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.cols()));
  Softmax out{q.cast<double>() * k.cast<double>().transpose() * scale,
              DoubleMatrix::Zero(q.rows(), k.rows()), Vector<double>::Zero(q.rows()),
              Vector<double>::Constant(q.rows(), -INFINITY)};
  const DoubleMatrix t =
      o.softcap > 0 ? DoubleMatrix(o.softcap * (out.s.array() / o.softcap).tanh()) : out.s;
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    double m = sink.value_or(-INFINITY);
    for (Eigen::Index j = 0; j < k.rows(); ++j)
      if (attention_visible(qm, i, km, j, o.window)) m = std::max(m, t(i, j));
    if (m == -INFINITY) continue;  // nothing seen, no sink: a zero row
    double total = sink ? std::exp(*sink - m) : 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j)
      if (attention_visible(qm, i, km, j, o.window)) total += out.p(i, j) = std::exp(t(i, j) - m);
    out.p.row(i) /= total;
    if (sink) out.sink(i) = std::exp(*sink - m) / total;
    out.lse(i) = m + std::log(total);
  }
  return out;
}

std::optional<double> sink_of(const AttentionOptions& o, std::size_t head) {
  if (o.sinks.empty()) return std::nullopt;
  return o.sinks[head];
}

}  // namespace

bool attention_visible(const TokenMeta& queries, Eigen::Index i, const TokenMeta& keys,
                       Eigen::Index j, std::int64_t window) {
  return attention_allowed(queries, i, keys, j) &&
         (window == 0 || queries.position(i) - keys.position(j) < window);
}

NeededKeys needed_keys(const std::vector<TokenMeta>& ranks, std::int64_t window) {
  NeededKeys needed(ranks.size(), std::vector<std::vector<Eigen::Index>>(ranks.size()));
  for (std::size_t r = 0; r < ranks.size(); ++r)
    for (std::size_t o = 0; o < ranks.size(); ++o) {
      if (o == r) continue;
      for (Eigen::Index j = 0; j < ranks[o].position.size(); ++j) {
        bool seen = false;
        for (Eigen::Index i = 0; i < ranks[r].position.size() && !seen; ++i)
          seen = attention_visible(ranks[r], i, ranks[o], j, window);
        if (seen) needed[r][o].push_back(j);
      }
    }
  return needed;
}

std::vector<HeadsOutput> cp_attention(const std::vector<RankHeads>& ranks,
                                      const AttentionOptions& options) {
  check_heads(ranks, options);
  const std::size_t hq = ranks[0].q.size(), group = hq / ranks[0].k.size();
  const TokenMeta keys = row_meta(ranks);
  std::vector<HeadsOutput> out(ranks.size());
  for (std::size_t h = 0; h < hq; ++h) {
    const FloatMatrix k = row_of(ranks, &RankHeads::k, h / group);
    const FloatMatrix v = row_of(ranks, &RankHeads::v, h / group);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const Softmax sm =
          softmax(ranks[r].q[h], k, ranks[r].meta, keys, options, sink_of(options, h));
      out[r].out.push_back((sm.p * v.cast<double>()).cast<float>());
      out[r].lse.push_back(sm.lse);
    }
  }
  return out;
}

std::vector<HeadsGrads> cp_attention_backward(const std::vector<RankHeads>& ranks,
                                              const std::vector<std::vector<FloatMatrix>>& d_out,
                                              const AttentionOptions& options) {
  check_heads(ranks, options);
  if (d_out.size() != ranks.size())
    raise("d_out", "has ", d_out.size(), " ranks but the inputs have ", ranks.size());
  const std::size_t hq = ranks[0].q.size(), hkv = ranks[0].k.size(), group = hq / hkv;
  const double scale = options.scale > 0
                           ? options.scale
                           : 1.0 / std::sqrt(static_cast<double>(ranks[0].q[0].cols()));
  const TokenMeta keys = row_meta(ranks);
  std::vector<HeadsGrads> grads(ranks.size());
  for (HeadsGrads& g : grads) g.dsinks.assign(options.sinks.size(), 0.0);
  for (std::size_t g = 0; g < hkv; ++g) {
    const FloatMatrix k = row_of(ranks, &RankHeads::k, g), v = row_of(ranks, &RankHeads::v, g);
    DoubleMatrix dk = DoubleMatrix::Zero(k.rows(), k.cols()), dv = dk;
    for (std::size_t h = g * group; h < (g + 1) * group; ++h)
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (d_out[r].size() != hq || d_out[r][h].rows() != ranks[r].q[h].rows() ||
            d_out[r][h].cols() != v.cols())
          raise("d_out", "must hold one [L, D] matrix per query head on every rank");
        const Softmax sm =
            softmax(ranks[r].q[h], k, ranks[r].meta, keys, options, sink_of(options, h));
        const DoubleMatrix d_o = d_out[r][h].cast<double>();
        const DoubleMatrix d_p = d_o * v.cast<double>().transpose();
        // Softmax backward; the sink's column has no value, so its dP is 0.
        const Vector<double> row_dot = (sm.p.array() * d_p.array()).rowwise().sum();
        DoubleMatrix d_s = sm.p.array() * (d_p.colwise() - row_dot).array();
        if (options.softcap > 0)
          d_s.array() *= 1.0 - (sm.s.array() / options.softcap).tanh().square();
        if (!options.sinks.empty()) grads[r].dsinks[h] -= sm.sink.dot(row_dot);
        grads[r].dq.push_back((d_s * k.cast<double>() * scale).cast<float>());
        dk += d_s.transpose() * ranks[r].q[h].cast<double>() * scale;
        dv += sm.p.transpose() * d_o;
      }
    Eigen::Index at = 0;  // each owner's rows of the summed key gradients
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const Eigen::Index n = ranks[r].meta.position.size();
      grads[r].dk.push_back(dk.middleRows(at, n).cast<float>());
      grads[r].dv.push_back(dv.middleRows(at, n).cast<float>());
      at += n;
    }
  }
  return grads;
}

}  // namespace cpkit::reference
