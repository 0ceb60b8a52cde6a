// Varlen attention with FlashAttention's semantics, in double, segment by segment: what a
// kernel driven by cpkit's attention offsets computes.
#include <cmath>

#include "cpkit/reference/attention.hpp"
#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

using Doubles = Eigen::MatrixXd;

void check_offsets(const FloatMatrix& q, const FloatMatrix& k, const IntVector& cu_q,
                   const IntVector& cu_k) {
  if (cu_q.size() != cu_k.size() || cu_q.size() < 1)
    raise("cu_seqlens_q", "has ", cu_q.size(), " entries but cu_seqlens_k has ", cu_k.size());
  if (cu_q(0) != 0 || cu_k(0) != 0) raise("cu_seqlens_q", "must start at 0");
  for (Eigen::Index i = 0; i + 1 < cu_q.size(); ++i)
    if (cu_q(i + 1) < cu_q(i) || cu_k(i + 1) < cu_k(i))
      raise("cu_seqlens_q", "segment ", i, " has a negative length");
  if (cu_q(cu_q.size() - 1) > q.rows() || cu_k(cu_k.size() - 1) > k.rows())
    raise("cu_seqlens_k", "ends past the ", q.rows(), " queries or ", k.rows(), " keys");
}

// Softmax probabilities of one segment: [m, n], causal with bottom-right alignment.
Doubles probabilities(const Doubles& q, const Doubles& k) {
  const auto m = q.rows(), n = k.rows();
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  Doubles p = Doubles::Zero(m, n);
  for (Eigen::Index a = 0; a < m; ++a) {
    const Eigen::Index last = a + n - m;  // keys 0..last are visible
    if (last < 0) continue;
    double max_score = -INFINITY;
    for (Eigen::Index j = 0; j <= last; ++j)
      max_score = std::max(max_score, q.row(a).dot(k.row(j)) * scale);
    double total = 0;
    for (Eigen::Index j = 0; j <= last; ++j) {
      p(a, j) = std::exp(q.row(a).dot(k.row(j)) * scale - max_score);
      total += p(a, j);
    }
    p.row(a) /= total;
  }
  return p;
}

}  // namespace

FloatMatrix varlen_attention(const FloatMatrix& q, const FloatMatrix& k, const FloatMatrix& v,
                             const IntVector& cu_q, const IntVector& cu_k) {
  check_offsets(q, k, cu_q, cu_k);
  FloatMatrix out = FloatMatrix::Zero(q.rows(), v.cols());
  for (Eigen::Index i = 0; i + 1 < cu_q.size(); ++i) {
    const auto m = cu_q(i + 1) - cu_q(i), n = cu_k(i + 1) - cu_k(i);
    const Doubles qs = q.middleRows(cu_q(i), m).cast<double>();
    const Doubles ks = k.middleRows(cu_k(i), n).cast<double>();
    const Doubles vs = v.middleRows(cu_k(i), n).cast<double>();
    out.middleRows(cu_q(i), m) = (probabilities(qs, ks) * vs).cast<float>();
  }
  return out;
}

AttentionGrads varlen_attention_backward(const FloatMatrix& q, const FloatMatrix& k,
                                         const FloatMatrix& v, const IntVector& cu_q,
                                         const IntVector& cu_k, const FloatMatrix& d_out) {
  check_offsets(q, k, cu_q, cu_k);
  Doubles dq = Doubles::Zero(q.rows(), q.cols()), dk = Doubles::Zero(k.rows(), k.cols());
  Doubles dv = Doubles::Zero(v.rows(), v.cols());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  for (Eigen::Index i = 0; i + 1 < cu_q.size(); ++i) {
    const auto m = cu_q(i + 1) - cu_q(i), n = cu_k(i + 1) - cu_k(i);
    const Doubles qs = q.middleRows(cu_q(i), m).cast<double>();
    const Doubles ks = k.middleRows(cu_k(i), n).cast<double>();
    const Doubles vs = v.middleRows(cu_k(i), n).cast<double>();
    const Doubles dos = d_out.middleRows(cu_q(i), m).cast<double>();
    const Doubles p = probabilities(qs, ks);
    const Doubles dp = dos * vs.transpose();
    // dS = P o (dP - rowsum(dP o P)): the softmax's backward, zero where P is masked.
    const Eigen::VectorXd row = (dp.cwiseProduct(p)).rowwise().sum();
    const Doubles ds = p.cwiseProduct(dp.colwise() - row);
    dq.middleRows(cu_q(i), m) += ds * ks * scale;
    dk.middleRows(cu_k(i), n) += ds.transpose() * qs * scale;
    dv.middleRows(cu_k(i), n) += p.transpose() * dos;
  }
  return {dq.cast<float>(), dk.cast<float>(), dv.cast<float>()};
}

}  // namespace cpkit::reference
