// Right-padding of primary streams to S_pad (internal header).
#pragma once

#include "cpkit/reference/types.hpp"

namespace cpkit::reference::detail {

// ids [rows, S] -> [rows, padded_len], new columns hold pad_token_id.
inline IntMatrix pad_ids(const IntMatrix& ids, Eigen::Index padded_len, std::int64_t pad_token_id) {
  IntMatrix padded = IntMatrix::Constant(ids.rows(), padded_len, pad_token_id);
  padded.leftCols(ids.cols()) = ids;
  return padded;
}

// embeddings [S, H] -> [padded_len, H], new rows are zero.
inline FloatMatrix pad_embeds(const FloatMatrix& embeds, Eigen::Index padded_len) {
  FloatMatrix padded = FloatMatrix::Zero(padded_len, embeds.cols());
  padded.topRows(embeds.rows()) = embeds;
  return padded;
}

}  // namespace cpkit::reference::detail
