// prepare_packed_cp_inputs: packed documents, one row per microbatch (SPEC 3).
#include "checks.hpp"
#include "cpkit/reference/sharder.hpp"
#include "pad.hpp"

namespace cpkit::reference {

namespace {

struct Document {
  std::int64_t length;  // real tokens
  std::int64_t slot;    // tokens the document occupies, padding included
};

// Reads one row of seq_lens / seq_lens_padded, enforcing the sentinel and length rules.
std::vector<Document> parse_documents(const PackedBatch& batch, Eigen::Index row, std::int64_t T) {
  std::vector<Document> docs;
  bool ended = false;
  std::int64_t total = 0;
  for (Eigen::Index d = 0; d < batch.seq_lens.cols(); ++d) {
    const auto len = batch.seq_lens(row, d);
    const auto slot = batch.seq_lens_padded(row, d);
    if ((len == kSeqLenSentinel) != (slot == kSeqLenSentinel))
      raise("seq_lens_padded", "row ", row, " entry ", d, " is ", slot, " but seq_lens has ", len,
            ": -1000 sentinels must stand at the same places in both");
    if (len == kSeqLenSentinel) {
      ended = true;
      continue;
    }
    if (ended)
      raise("seq_lens", "row ", row, " entry ", d, " = ", len,
            " follows a -1000 sentinel; sentinels may only end the list");
    if (len < 0) raise("seq_lens", "row ", row, " entry ", d, " is negative: ", len);
    if (slot < 0) raise("seq_lens_padded", "row ", row, " entry ", d, " is negative: ", slot);
    if (len > slot)
      raise("seq_lens", "row ", row, " document ", d, " has length ", len,
            " but its slot (seq_lens_padded) is only ", slot);
    docs.push_back({len, slot});
    total += slot;
  }
  if (docs.empty()) raise("seq_lens", "row ", row, " has no document, only -1000 sentinels");
  if (total > T)
    raise("seq_lens_padded", "row ", row, " slots sum to ", total, " but the row holds T = ", T,
          " tokens");
  return docs;
}

void check_packed(const PackedBatch& batch, const ShardOptions& options) {
  detail::check_options(options);
  if (batch.input_ids.has_value() == batch.inputs_embeds.has_value())
    raise("input_ids", "exactly one of input_ids and inputs_embeds must be given, got ",
          batch.input_ids ? "both" : "neither");
  const auto rows = batch.labels.rows();
  const auto T = batch.labels.cols();
  if (rows == 0 || T == 0) raise("labels", "empty batch: shape [", rows, ", ", T, "]");
  if (rows != options.num_chunks)
    raise("num_chunks", "a packed batch holds one row per microbatch, but labels has ", rows,
          " rows and num_chunks = ", options.num_chunks);
  if (batch.input_ids) detail::check_shape("input_ids", *batch.input_ids, rows, T);
  if (batch.inputs_embeds) detail::check_embeds(*batch.inputs_embeds, rows, T);
  if (batch.seq_lens.rows() != rows || batch.seq_lens.cols() < 1)
    raise("seq_lens", "has shape [", batch.seq_lens.rows(), ", ", batch.seq_lens.cols(), "] but [",
          rows, ", D >= 1] is required");
  detail::check_shape("seq_lens_padded", batch.seq_lens_padded, rows, batch.seq_lens.cols());
  detail::check_label_values(batch.labels);
  detail::check_images(batch.images);
}

GlobalStreams packed_microbatch(const PackedBatch& batch, const ShardOptions& options,
                                Eigen::Index row) {
  const auto T = batch.labels.cols();
  const std::vector<Document> docs = parse_documents(batch, row, T);
  GlobalStreams g;
  g.seq_len = T;
  g.padded_len = layout_padded_length(options.layout, T, options.cp_size, options.pad_multiple);
  std::vector<std::int64_t> slots;
  for (const Document& d : docs) slots.push_back(d.slot);
  g.owned =
      options.layout == "balanced"
          ? plan_balanced_positions(slots, g.padded_len, options.cp_size, options.balance_slack)
          : plan_positions(options.layout, g.padded_len, options.cp_size);
  const auto T_pad = g.padded_len;
  g.labels.resize(1, T_pad);
  g.position_ids.resize(1, T_pad);
  g.document_ids.resize(1, T_pad);
  g.padding.resize(1, T_pad);
  g.valid.resize(1, T_pad);
  g.cu_seqlens = IntVector::Zero(static_cast<Eigen::Index>(docs.size()) + 1);
  g.cu_seqlens_padded = IntVector::Zero(static_cast<Eigen::Index>(docs.size()) + 1);

  // Row-tail defaults: document 0, position 0, padding, ignored label.
  g.document_ids.setZero();
  g.position_ids.setZero();
  g.padding.setConstant(true);
  g.labels.setConstant(kIgnoreLabel);
  g.valid.setConstant(false);

  std::int64_t slot_start = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const auto k = static_cast<Eigen::Index>(i);
    g.cu_seqlens(k + 1) = g.cu_seqlens(k) + docs[i].length;
    g.cu_seqlens_padded(k + 1) = g.cu_seqlens_padded(k) + docs[i].slot;
    for (std::int64_t offset = 0; offset < docs[i].slot; ++offset) {
      const auto t = slot_start + offset;
      const bool padding = offset >= docs[i].length;
      g.document_ids(0, t) = static_cast<std::int64_t>(i) + 1;
      g.position_ids(0, t) = offset;  // restarts per document, counts through slot padding
      g.padding(0, t) = padding;
      g.labels(0, t) = padding ? kIgnoreLabel : batch.labels(row, t);
      // A document's first token is predicted by nothing in that document.
      g.valid(0, t) = !padding && g.labels(0, t) != kIgnoreLabel && offset > 0;
    }
    slot_start += docs[i].slot;
  }

  if (batch.input_ids) {
    const IntMatrix ids = batch.input_ids->row(row);
    g.input_ids = options.shard_primary ? detail::pad_ids(ids, T_pad, options.pad_token_id) : ids;
  }
  if (batch.inputs_embeds) {
    const FloatMatrix& embeds = (*batch.inputs_embeds)[static_cast<std::size_t>(row)];
    g.inputs_embeds = FloatRows{options.shard_primary ? detail::pad_embeds(embeds, T_pad) : embeds};
  }
  return g;
}

}  // namespace

Sharder prepare_packed_cp_inputs(const PackedBatch& batch, const ShardOptions& options) {
  check_packed(batch, options);
  std::vector<GlobalStreams> microbatches;
  for (Eigen::Index row = 0; row < batch.labels.rows(); ++row)
    microbatches.push_back(packed_microbatch(batch, options, row));
  return Sharder(options, std::move(microbatches), batch.images);
}

}  // namespace cpkit::reference
