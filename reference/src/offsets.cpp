// attention_offsets: group the global row into attention documents, then cut the rank's
// tokens into fragments, each attending from its document's first token to its own last.
#include "cpkit/reference/offsets.hpp"

#include <algorithm>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

// For every token of row b: the global index where its attention document starts. A
// document is a run of one document id; padding before the document's first real token is
// a document of its own (BSHD left padding). Real tokens must be contiguous within a
// document and their positions increasing, or no varlen offsets express the mask.
std::vector<std::int64_t> document_starts(const GlobalStreams& g, Eigen::Index b) {
  const auto T = g.padded_len;
  std::vector<std::int64_t> start(static_cast<std::size_t>(T));
  std::int64_t current = 0, last_real = -1;
  bool padding_after_real = false;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool pad = g.padding(b, t);
    const bool new_document = t == 0 || g.document_ids(b, t) != g.document_ids(b, t - 1);
    const bool real_after_left_padding =
        !new_document && !pad && last_real < current && g.padding(b, t - 1);
    if (new_document || real_after_left_padding) {
      current = t;
      padding_after_real = false;
    }
    if (pad && last_real >= current) padding_after_real = true;
    if (!pad) {
      if (padding_after_real)
        raise("attention_mask", "row ", b, " has padding at ", t - 1,
              " between real tokens: varlen offsets need left or right padding only");
      if (last_real >= current && g.position_ids(b, t) <= g.position_ids(b, last_real))
        raise("position_ids", "row ", b, " position ", g.position_ids(b, t), " at ", t,
              " does not follow ", g.position_ids(b, last_real), " at ", last_real,
              ": varlen attention is causal by token order, positions must increase");
      last_real = t;
    }
    start[static_cast<std::size_t>(t)] = current;
  }
  return start;
}

}  // namespace

AttentionOffsets attention_offsets(const Sharder& sharder, int microbatch, int rank) {
  const GlobalStreams& g = sharder.global(microbatch);
  const Layout l = sharder.layout(microbatch, rank);
  // One key range per rank: the gathered keys in rank order hold it only when the rank's
  // tokens are one run of positions.
  for (std::size_t j = 1; j < l.positions.size(); ++j)
    if (l.positions[j] != l.positions[j - 1] + 1)
      raise("layout",
            "attention offsets cover one fragment per rank (\"contiguous\" layouts) so "
            "far; rank ",
            rank, " of this \"", sharder.options().layout, "\" layout holds more");
  const std::int64_t begin = l.positions.front(), end = l.positions.back() + 1;
  const Eigen::Index rows = g.labels.rows();
  std::vector<std::vector<std::int64_t>> starts;
  for (Eigen::Index b = 0; b < rows; ++b) starts.push_back(document_starts(g, b));

  AttentionOffsets out;
  out.k_end = end;
  out.k_begin = end;
  for (const auto& s : starts) out.k_begin = std::min(out.k_begin, s[begin]);

  std::vector<std::int64_t> q{0}, k{0};
  auto add = [&](std::int64_t q_len, std::int64_t k_len) {
    q.push_back(q.back() + q_len);
    k.push_back(k.back() + k_len);
    out.max_seqlen_q = std::max(out.max_seqlen_q, q_len);
    out.max_seqlen_k = std::max(out.max_seqlen_k, k_len);
  };
  for (Eigen::Index b = 0; b < rows; ++b) {
    const auto& s = starts[static_cast<std::size_t>(b)];
    std::int64_t key = out.k_begin;  // the next key of this row's slice not yet covered
    std::int64_t t = begin;
    while (t < end) {
      std::int64_t u = t + 1;
      while (u < end && s[u] == s[t]) ++u;
      // Keys this row's slice skips before the fragment's document: a segment with no query.
      if (s[t] > key) add(0, s[t] - key);
      add(u - t, u - s[t]);
      key = u;
      t = u;
    }
  }
  out.cu_seqlens_q = Eigen::Map<IntVector>(q.data(), static_cast<Eigen::Index>(q.size()));
  out.cu_seqlens_k = Eigen::Map<IntVector>(k.data(), static_cast<Eigen::Index>(k.size()));
  return out;
}

}  // namespace cpkit::reference
