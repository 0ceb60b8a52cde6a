// gather_tokens (SPEC 4), simulated: the caller holds every rank's tensor.
#pragma once

#include "cpkit/reference/error.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

namespace detail {
template <class Scalar>
void check_same_counts(const std::vector<Matrix<Scalar>>& per_rank, const char* argument) {
  if (per_rank.empty()) raise(argument, "no ranks given");
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    if (per_rank[r].rows() != per_rank[0].rows())
      raise(argument, "rank 0 holds ", per_rank[0].rows(), " tokens but rank ", r, " holds ",
            per_rank[r].rows());
    if (per_rank[r].cols() != per_rank[0].cols())
      raise(argument, "rank 0 has trailing size ", per_rank[0].cols(), " but rank ", r, " has ",
            per_rank[r].cols());
  }
}
}  // namespace detail

// Forward: rank r holds [N, F]; every rank receives [CP * N, F], rank 0's rows first.
template <class Scalar>
Matrix<Scalar> gather_tokens(const std::vector<Matrix<Scalar>>& per_rank) {
  detail::check_same_counts(per_rank, "value");
  const auto n = per_rank[0].rows();
  Matrix<Scalar> gathered(n * static_cast<Eigen::Index>(per_rank.size()), per_rank[0].cols());
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    gathered.middleRows(static_cast<Eigen::Index>(r) * n, n) = per_rank[r];
  return gathered;
}

// Backward (reduce-scatter SUM): upstream[q] is the [CP * N, F] gradient rank q received
// for the gathered tensor; rank r's input gradient is the sum over q of its rows
// [r * N, (r + 1) * N). No division by CP.
inline std::vector<FloatMatrix> gather_tokens_backward(const std::vector<FloatMatrix>& upstream) {
  detail::check_same_counts(upstream, "grad_output");
  const auto cp = static_cast<Eigen::Index>(upstream.size());
  if (upstream[0].rows() % cp != 0)
    raise("grad_output", "holds ", upstream[0].rows(), " rows, not a multiple of CP = ", cp);
  const auto n = upstream[0].rows() / cp;
  std::vector<FloatMatrix> grads;
  for (Eigen::Index r = 0; r < cp; ++r) {
    FloatMatrix sum = FloatMatrix::Zero(n, upstream[0].cols());
    for (const auto& from_rank : upstream) sum += from_rank.middleRows(r * n, n);
    grads.push_back(sum);
  }
  return grads;
}

// [rows, L] streams (ids, labels, positions, ...) gathered along the sequence axis:
// [rows, CP * L], rank 0's columns first. Not differentiable.
template <class Scalar>
Matrix<Scalar> gather_sequence(const std::vector<Matrix<Scalar>>& per_rank) {
  std::vector<Matrix<Scalar>> transposed;
  for (const auto& m : per_rank) transposed.push_back(m.transpose());
  return gather_tokens(transposed).transpose();
}

}  // namespace cpkit::reference
