// Plain Eigen types the reference is written in. Row-major everywhere, matching the row-major
// tensors of the SPEC: a [B, S] stream is an IntMatrix with B rows and S columns.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace cpkit::reference {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

using IntMatrix = Matrix<std::int64_t>;  // [B, S] ids, labels, positions, document ids
using BoolMatrix = Matrix<bool>;         // [B, S] padding flags
using FloatMatrix = Matrix<float>;       // [tokens, features]
using IntVector = Vector<std::int64_t>;
using BoolVector = Vector<bool>;  // flattened [B * L] valid-target mask

// A [B, S, H] tensor: one [S, H] matrix per batch row, so rows can be cut independently.
using FloatRows = std::vector<FloatMatrix>;

// The label value that marks a token the loss ignores (HF / PyTorch convention).
inline constexpr std::int64_t kIgnoreLabel = -100;
// Ends a ragged document list in seq_lens / seq_lens_padded.
inline constexpr std::int64_t kSeqLenSentinel = -1000;

// A complete image [C, H, W]; never sharded, only validated and passed through.
struct Image {
  std::vector<std::int64_t> shape;  // must have three positive entries
  std::vector<float> values;        // C * H * W values, row-major
};

}  // namespace cpkit::reference
