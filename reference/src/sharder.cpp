#include "cpkit/reference/sharder.hpp"

#include "cpkit/reference/error.hpp"
#include "pad.hpp"

namespace cpkit::reference {

Sharder::Sharder(ShardOptions options, std::vector<GlobalStreams> microbatches,
                 std::vector<Image> images)
    : options_(options), microbatches_(std::move(microbatches)), images_(std::move(images)) {}

void Sharder::check_microbatch(int microbatch) const {
  if (microbatch < 0 || microbatch >= num_microbatches())
    raise("microbatch", "must be in [0, ", num_microbatches(), "), got ", microbatch);
}

void Sharder::check_rank(int rank) const {
  if (rank < 0 || rank >= options_.cp_size)
    raise("rank", "must be in [0, ", options_.cp_size, "), got ", rank);
}

const GlobalStreams& Sharder::global(int microbatch) const {
  check_microbatch(microbatch);
  return microbatches_[static_cast<std::size_t>(microbatch)];
}

Layout Sharder::layout(int microbatch, int rank) const {
  check_rank(rank);
  const GlobalStreams& g = global(microbatch);
  Layout layout;
  layout.cp_size = options_.cp_size;
  layout.rank = rank;
  layout.seq_len = g.seq_len;
  layout.padded_len = g.padded_len;
  layout.local_len = g.padded_len / options_.cp_size;
  layout.positions = g.owned[static_cast<std::size_t>(rank)];
  const bool contiguous = options_.layout == "contiguous";
  layout.begin = contiguous ? rank * layout.local_len : -1;
  layout.end = contiguous ? layout.begin + layout.local_len : -1;
  return layout;
}

namespace {
// The columns (tokens) at the layout's positions, in local order.
template <class Scalar>
Matrix<Scalar> cut_columns(const Matrix<Scalar>& m, const Layout& l) {
  Matrix<Scalar> out(m.rows(), l.local_len);
  for (Eigen::Index j = 0; j < l.local_len; ++j) out.col(j) = m.col(l.positions[j]);
  return out;
}

FloatRows cut_rows(const FloatRows& rows, const Layout& l) {
  FloatRows out;
  for (const auto& row : rows) {
    FloatMatrix mine(l.local_len, row.cols());
    for (Eigen::Index j = 0; j < l.local_len; ++j) mine.row(j) = row.row(l.positions[j]);
    out.push_back(mine);
  }
  return out;
}
}  // namespace

LocalShard Sharder::local(int microbatch, int rank) const {
  const Layout l = layout(microbatch, rank);
  const GlobalStreams& g = global(microbatch);
  LocalShard shard;
  shard.layout = l;
  if (options_.shard_primary) {
    if (g.input_ids) shard.input_ids = cut_columns(*g.input_ids, l);
    if (g.inputs_embeds) shard.inputs_embeds = cut_rows(*g.inputs_embeds, l);
  }
  shard.labels = cut_columns(g.labels, l);
  shard.position_ids = cut_columns(g.position_ids, l);
  shard.document_ids = cut_columns(g.document_ids, l);
  shard.padding = cut_columns(g.padding, l);
  const BoolMatrix valid = cut_columns(g.valid, l);
  shard.valid = valid.reshaped<Eigen::RowMajor>();
  return shard;
}

FloatRows Sharder::cut_spliced(int microbatch, int rank, const FloatRows& spliced) const {
  const Layout l = layout(microbatch, rank);
  const auto rows = global(microbatch).labels.rows();
  if (static_cast<Eigen::Index>(spliced.size()) != rows)
    raise("spliced", "has ", spliced.size(), " rows but the microbatch has ", rows);
  FloatRows padded;
  for (std::size_t b = 0; b < spliced.size(); ++b) {
    if (spliced[b].rows() != l.seq_len || spliced[b].cols() < 1)
      raise("spliced", "row ", b, " has shape [", spliced[b].rows(), ", ", spliced[b].cols(),
            "] but [", l.seq_len, ", H >= 1] is required");
    padded.push_back(detail::pad_embeds(spliced[b], l.padded_len));
  }
  return cut_rows(padded, l);
}

FloatRows Sharder::cut_spliced_backward(int microbatch, int rank,
                                        const FloatRows& grad_local) const {
  const Layout l = layout(microbatch, rank);
  FloatRows grads;
  for (std::size_t b = 0; b < grad_local.size(); ++b) {
    if (grad_local[b].rows() != l.local_len)
      raise("grad_local", "row ", b, " has ", grad_local[b].rows(), " tokens, expected ",
            l.local_len);
    FloatMatrix padded = FloatMatrix::Zero(l.padded_len, grad_local[b].cols());
    for (Eigen::Index j = 0; j < l.local_len; ++j)
      padded.row(l.positions[j]) = grad_local[b].row(j);
    grads.push_back(padded.topRows(l.seq_len));
  }
  return grads;
}

IntMatrix Sharder::cut_ids(int microbatch, int rank, const IntMatrix& ids) const {
  const Layout l = layout(microbatch, rank);
  const auto rows = global(microbatch).labels.rows();
  if (ids.rows() != rows || ids.cols() != l.seq_len)
    raise("ids", "has shape [", ids.rows(), ", ", ids.cols(), "] but [", rows, ", ", l.seq_len,
          "] is required");
  return cut_columns(detail::pad_ids(ids, l.padded_len, options_.pad_token_id), l);
}

}  // namespace cpkit::reference
