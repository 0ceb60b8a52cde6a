// Masked attention in double precision, written as the textbook formulas.
#include "cpkit/reference/attention.hpp"

#include <cmath>

#include "cpkit/reference/error.hpp"
#include "cpkit/reference/gather.hpp"

namespace cpkit::reference {

namespace {

using DoubleMatrix = Matrix<double>;

void check_meta(const char* argument, const TokenMeta& meta, Eigen::Index tokens) {
  if (meta.position.size() != tokens || meta.document.size() != tokens ||
      meta.padding.size() != tokens)
    raise(argument, "metadata covers ", meta.position.size(), "/", meta.document.size(), "/",
          meta.padding.size(), " tokens (position/document/padding) but there are ", tokens);
}

void check_qkv(const FloatMatrix& q, const FloatMatrix& k, const FloatMatrix& v,
               const TokenMeta& q_meta, const TokenMeta& k_meta) {
  if (q.cols() != k.cols())
    raise("k", "head size ", k.cols(), " differs from the queries' ", q.cols());
  if (v.rows() != k.rows()) raise("v", "holds ", v.rows(), " tokens but k holds ", k.rows());
  check_meta("q_meta", q_meta, q.rows());
  check_meta("k_meta", k_meta, k.rows());
}

// Row-wise softmax of the masked scores; a row with no allowed key is all zero.
DoubleMatrix probabilities(const FloatMatrix& q, const FloatMatrix& k, const TokenMeta& q_meta,
                           const TokenMeta& k_meta) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  const DoubleMatrix scores = q.cast<double>() * k.cast<double>().transpose() * scale;
  DoubleMatrix p = DoubleMatrix::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    double max_score = -INFINITY;
    for (Eigen::Index j = 0; j < k.rows(); ++j)
      if (attention_allowed(q_meta, i, k_meta, j)) max_score = std::max(max_score, scores(i, j));
    if (max_score == -INFINITY) continue;
    double total = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j)
      if (attention_allowed(q_meta, i, k_meta, j)) {
        p(i, j) = std::exp(scores(i, j) - max_score);
        total += p(i, j);
      }
    p.row(i) /= total;
  }
  return p;
}

// Keys, values and their metadata as every rank sees them after the gather.
struct GatheredKeys {
  FloatMatrix k, v;
  TokenMeta meta;
};

GatheredKeys gather_keys(const std::vector<RankAttention>& ranks) {
  std::vector<FloatMatrix> ks, vs;
  std::vector<TokenMeta> metas;
  for (const auto& r : ranks) {
    ks.push_back(r.k);
    vs.push_back(r.v);
    metas.push_back(r.meta);
  }
  return {gather_tokens(ks), gather_tokens(vs), concatenate_meta(metas)};
}

}  // namespace

TokenMeta concatenate_meta(const std::vector<TokenMeta>& metas) {
  Eigen::Index total = 0;
  for (const TokenMeta& m : metas) total += m.position.size();
  TokenMeta all{IntVector(total), IntVector(total), BoolVector(total)};
  Eigen::Index at = 0;
  for (const TokenMeta& m : metas) {
    const auto n = m.position.size();
    all.position.segment(at, n) = m.position;
    all.document.segment(at, n) = m.document;
    all.padding.segment(at, n) = m.padding;
    at += n;
  }
  return all;
}

bool attention_allowed(const TokenMeta& queries, Eigen::Index q, const TokenMeta& keys,
                       Eigen::Index k) {
  return queries.document(q) > 0 && queries.document(q) == keys.document(k) &&
         keys.position(k) <= queries.position(q) && !keys.padding(k);
}

FloatMatrix masked_attention(const FloatMatrix& q, const FloatMatrix& k, const FloatMatrix& v,
                             const TokenMeta& q_meta, const TokenMeta& k_meta) {
  check_qkv(q, k, v, q_meta, k_meta);
  return (probabilities(q, k, q_meta, k_meta) * v.cast<double>()).cast<float>();
}

AttentionGrads masked_attention_backward(const FloatMatrix& q, const FloatMatrix& k,
                                         const FloatMatrix& v, const TokenMeta& q_meta,
                                         const TokenMeta& k_meta, const FloatMatrix& d_out) {
  check_qkv(q, k, v, q_meta, k_meta);
  if (d_out.rows() != q.rows() || d_out.cols() != v.cols())
    raise("d_out", "has shape [", d_out.rows(), ", ", d_out.cols(), "] but [", q.rows(), ", ",
          v.cols(), "] is required");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  const DoubleMatrix p = probabilities(q, k, q_meta, k_meta);
  const DoubleMatrix d_o = d_out.cast<double>();
  const DoubleMatrix d_p = d_o * v.cast<double>().transpose();
  // Softmax backward: dS_ij = P_ij * (dP_ij - sum_k P_ik dP_ik); masked entries have P = 0.
  const Vector<double> row_dot = (p.array() * d_p.array()).rowwise().sum();
  const DoubleMatrix d_s = p.array() * (d_p.colwise() - row_dot).array();
  AttentionGrads g;
  g.dq = (d_s * k.cast<double>() * scale).cast<float>();
  g.dk = (d_s.transpose() * q.cast<double>() * scale).cast<float>();
  g.dv = (p.transpose() * d_o).cast<float>();
  return g;
}

std::vector<FloatMatrix> cp_attention(const std::vector<RankAttention>& ranks) {
  const GatheredKeys keys = gather_keys(ranks);
  std::vector<FloatMatrix> out;
  for (const auto& r : ranks)
    out.push_back(masked_attention(r.q, keys.k, keys.v, r.meta, keys.meta));
  return out;
}

std::vector<AttentionGrads> cp_attention_backward(const std::vector<RankAttention>& ranks,
                                                  const std::vector<FloatMatrix>& d_out) {
  if (d_out.size() != ranks.size())
    raise("d_out", "has ", d_out.size(), " ranks but the inputs have ", ranks.size());
  const GatheredKeys keys = gather_keys(ranks);
  std::vector<AttentionGrads> grads;
  std::vector<FloatMatrix> dk_gathered, dv_gathered;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    AttentionGrads g =
        masked_attention_backward(ranks[r].q, keys.k, keys.v, ranks[r].meta, keys.meta, d_out[r]);
    dk_gathered.push_back(g.dk);
    dv_gathered.push_back(g.dv);
    grads.push_back({g.dq, {}, {}});
  }
  const std::vector<FloatMatrix> dk = gather_tokens_backward(dk_gathered);
  const std::vector<FloatMatrix> dv = gather_tokens_backward(dv_gathered);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    grads[r].dk = dk[r];
    grads[r].dv = dv[r];
  }
  return grads;
}

}  // namespace cpkit::reference
