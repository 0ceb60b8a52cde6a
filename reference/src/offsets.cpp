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
  const Eigen::Index rows = g.labels.rows();
  std::vector<std::vector<std::int64_t>> starts;
  for (Eigen::Index b = 0; b < rows; ++b) starts.push_back(document_starts(g, b));

  AttentionOffsets out;
  std::vector<std::int64_t> q{0}, k{0};
  auto add = [&](std::int64_t q_len, std::int64_t k_len) {
    q.push_back(q.back() + q_len);
    k.push_back(k.back() + k_len);
    out.max_seqlen_q = std::max(out.max_seqlen_q, q_len);
    out.max_seqlen_k = std::max(out.max_seqlen_k, k_len);
  };
  if (sharder.options().layout == "contiguous") {
    // Keys: one slice [k_begin, end) of every gathered row (rank order = global order).
    const std::int64_t begin = l.begin, end = l.end;
    out.k_end = end;
    out.k_begin = end;
    for (const auto& s : starts) out.k_begin = std::min(out.k_begin, s[begin]);
    for (Eigen::Index b = 0; b < rows; ++b) {
      const auto& s = starts[static_cast<std::size_t>(b)];
      std::int64_t key = out.k_begin;  // the next key of this row's slice not yet covered
      std::int64_t t = begin;
      while (t < end) {
        std::int64_t u = t + 1;
        while (u < end && s[u] == s[t]) ++u;
        // Keys this row's slice skips before the fragment's document: a segment, no query.
        if (s[t] > key) add(0, s[t] - key);
        add(u - t, u - s[t]);
        key = u;
        t = u;
      }
    }
  } else {
    // Keys picked one by one from the gathered rows (rank q's token j at q * L + j): each
    // run of the rank's tokens that is one range of one document is a segment, whose keys are
    // that document from its start to the run's end (repeated when a document has several
    // runs on this rank).
    const std::int64_t L = l.local_len, width = l.cp_size * L;
    std::vector<std::int64_t> gathered_at(static_cast<std::size_t>(l.padded_len));
    for (int other = 0; other < l.cp_size; ++other) {
      const Layout lo = sharder.layout(microbatch, other);
      for (std::int64_t j = 0; j < L; ++j)
        gathered_at[static_cast<std::size_t>(lo.positions[static_cast<std::size_t>(j)])] =
            other * L + j;
    }
    std::vector<std::int64_t> keys;
    for (Eigen::Index b = 0; b < rows; ++b) {
      const auto& s = starts[static_cast<std::size_t>(b)];
      std::int64_t j = 0;
      while (j < L) {
        const std::int64_t t = l.positions[static_cast<std::size_t>(j)];
        std::int64_t u = j + 1;
        while (u < L && l.positions[static_cast<std::size_t>(u)] == t + (u - j) &&
               s[static_cast<std::size_t>(t + (u - j))] == s[static_cast<std::size_t>(t)])
          ++u;
        const std::int64_t end = t + (u - j), first = s[static_cast<std::size_t>(t)];
        for (std::int64_t key = first; key < end; ++key)
          keys.push_back(b * width + gathered_at[static_cast<std::size_t>(key)]);
        add(u - j, end - first);
        j = u;
      }
    }
    out.k_index = Eigen::Map<IntVector>(keys.data(), static_cast<Eigen::Index>(keys.size()));
  }
  out.cu_seqlens_q = Eigen::Map<IntVector>(q.data(), static_cast<Eigen::Index>(q.size()));
  out.cu_seqlens_k = Eigen::Map<IntVector>(k.data(), static_cast<Eigen::Index>(k.size()));
  return out;
}

}  // namespace cpkit::reference
