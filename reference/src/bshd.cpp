// prepare_cp_inputs: BSHD streams computed on the global padded sequence (SPEC 2).
#include "checks.hpp"
#include "cpkit/reference/sharder.hpp"
#include "pad.hpp"

namespace cpkit::reference {

namespace {

void check_bshd(const BshdBatch& batch, const ShardOptions& options) {
  detail::check_options(options);
  if (batch.input_ids.has_value() == batch.inputs_embeds.has_value())
    raise("input_ids", "exactly one of input_ids and inputs_embeds must be given, got ",
          batch.input_ids ? "both" : "neither");
  const auto B = batch.labels.rows();
  const auto S = batch.labels.cols();
  if (B == 0 || S == 0) raise("labels", "empty batch: shape [", B, ", ", S, "]");
  if (batch.input_ids) detail::check_shape("input_ids", *batch.input_ids, B, S);
  if (batch.inputs_embeds) detail::check_embeds(*batch.inputs_embeds, B, S);
  if (batch.position_ids) detail::check_shape("position_ids", *batch.position_ids, B, S);
  if (batch.attention_mask) {
    detail::check_shape("attention_mask", *batch.attention_mask, B, S);
    for (Eigen::Index b = 0; b < B; ++b)
      for (Eigen::Index t = 0; t < S; ++t)
        if ((*batch.attention_mask)(b, t) != 0 && (*batch.attention_mask)(b, t) != 1)
          raise("attention_mask", "value ", (*batch.attention_mask)(b, t), " at [", b, ", ", t,
                "] is neither 0 nor 1");
  }
  detail::check_label_values(batch.labels);
  detail::check_images(batch.images);
  if (B % options.num_chunks != 0)
    raise("num_chunks", "must divide the batch size B = ", B, ", got ", options.num_chunks);
}

// The streams of batch rows [first, first + rows) as one microbatch.
GlobalStreams bshd_microbatch(const BshdBatch& batch, const ShardOptions& options,
                              Eigen::Index first, Eigen::Index rows) {
  const auto S = batch.labels.cols();
  GlobalStreams g;
  g.seq_len = S;
  if (options.layout == "balanced")
    raise("layout",
          "\"balanced\" plans packed (THD) documents; BSHD rows take \"contiguous\" "
          "or \"head_tail\"");
  g.padded_len = layout_padded_length(options.layout, S, options.cp_size, options.pad_multiple);
  g.owned = plan_positions(options.layout, g.padded_len, options.cp_size);
  const auto S_pad = g.padded_len;
  g.labels.resize(rows, S_pad);
  g.position_ids.resize(rows, S_pad);
  g.document_ids.resize(rows, S_pad);
  g.padding.resize(rows, S_pad);
  g.valid.resize(rows, S_pad);
  for (Eigen::Index b = 0; b < rows; ++b) {
    const auto row = first + b;
    auto position_at = [&](Eigen::Index t) -> std::int64_t {
      return batch.position_ids ? (*batch.position_ids)(row, t) : t;
    };
    for (Eigen::Index t = 0; t < S_pad; ++t) {
      const bool past_end = t >= S;
      const bool masked = !past_end && batch.attention_mask && (*batch.attention_mask)(row, t) == 0;
      const bool padding = past_end || masked;
      // Right padding continues the row's positions: last + 1, last + 2, ...
      g.position_ids(b, t) = past_end ? position_at(S - 1) + (t - S + 1) : position_at(t);
      g.document_ids(b, t) = past_end ? 0 : 1;  // the whole row is one document
      g.padding(b, t) = padding;
      g.labels(b, t) = padding ? kIgnoreLabel : batch.labels(row, t);
      // Position 0 is predicted by nothing, so it never counts as a target.
      g.valid(b, t) = !padding && g.labels(b, t) != kIgnoreLabel && t > 0;
    }
  }
  if (batch.input_ids) {
    const IntMatrix ids = batch.input_ids->middleRows(first, rows);
    g.input_ids = options.shard_primary ? detail::pad_ids(ids, S_pad, options.pad_token_id) : ids;
  }
  if (batch.inputs_embeds) {
    g.inputs_embeds.emplace();
    for (Eigen::Index b = 0; b < rows; ++b) {
      const FloatMatrix& row = (*batch.inputs_embeds)[static_cast<std::size_t>(first + b)];
      g.inputs_embeds->push_back(options.shard_primary ? detail::pad_embeds(row, S_pad) : row);
    }
  }
  return g;
}

}  // namespace

Sharder prepare_cp_inputs(const BshdBatch& batch, const ShardOptions& options) {
  check_bshd(batch, options);
  const auto rows = batch.labels.rows() / options.num_chunks;
  std::vector<GlobalStreams> microbatches;
  for (int m = 0; m < options.num_chunks; ++m)
    microbatches.push_back(bshd_microbatch(batch, options, m * rows, rows));
  return Sharder(options, std::move(microbatches), batch.images);
}

}  // namespace cpkit::reference
