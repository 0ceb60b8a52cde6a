// Layouts (SPEC 2b), token by token: an owner per global position, then each rank's list.
#include "cpkit/reference/layout.hpp"

#include <algorithm>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

// A document is cut head-tail when each of its 2 * CP chunks gets at least this many tokens.
constexpr std::int64_t kMinChunkTokens = 64;

LayoutPositions positions_of(const std::vector<int>& owner, int cp_size) {
  LayoutPositions out(static_cast<std::size_t>(cp_size));
  for (std::size_t t = 0; t < owner.size(); ++t)
    out[static_cast<std::size_t>(owner[t])].push_back(static_cast<std::int64_t>(t));
  return out;
}

struct Span {
  std::int64_t start;   // first global position
  std::int64_t length;  // tokens
};

// The planner's books: who owns each position, and each rank's tokens and work so far.
struct Books {
  std::vector<int> owner;
  std::vector<std::int64_t> tokens;
  std::vector<double> work;
  std::int64_t local_len;

  // Rank r takes tokens [from, to) of the document (offsets within it).
  void assign(int r, const Span& doc, std::int64_t from, std::int64_t to) {
    for (std::int64_t offset = from; offset < to; ++offset) {
      owner[static_cast<std::size_t>(doc.start + offset)] = r;
      tokens[static_cast<std::size_t>(r)] += 1;
      work[static_cast<std::size_t>(r)] += static_cast<double>(offset + 1);  // keys it attends
    }
  }
  std::int64_t room(int r) const { return local_len - tokens[static_cast<std::size_t>(r)]; }
};

}  // namespace

void check_layout_name(const std::string& layout) {
  if (layout != "contiguous" && layout != "head_tail" && layout != "balanced")
    raise("layout", "must be \"contiguous\", \"head_tail\" or \"balanced\", got \"", layout, "\"");
}

std::int64_t layout_padded_length(const std::string& layout, std::int64_t seq_len, int cp_size,
                                  int pad_multiple) {
  check_layout_name(layout);
  if (cp_size == 1) return seq_len;
  const std::int64_t multiple =
      (layout == "head_tail" ? 2 : 1) * static_cast<std::int64_t>(cp_size) * pad_multiple;
  return (seq_len + multiple - 1) / multiple * multiple;
}

LayoutPositions plan_positions(const std::string& layout, std::int64_t padded_len, int cp_size) {
  check_layout_name(layout);
  if (layout == "balanced")
    raise("layout", "\"balanced\" plans packed (THD) rows from their document lengths");
  std::vector<int> owner(static_cast<std::size_t>(padded_len));
  const std::int64_t L = padded_len / cp_size;
  for (std::int64_t t = 0; t < padded_len; ++t) {
    if (layout == "contiguous" || cp_size == 1) {
      owner[static_cast<std::size_t>(t)] = static_cast<int>(t / L);
    } else {  // chunk c of 2 CP belongs to rank c, or 2 CP - 1 - c in the second half
      const std::int64_t c = t / (L / 2);
      owner[static_cast<std::size_t>(t)] = static_cast<int>(c < cp_size ? c : 2 * cp_size - 1 - c);
    }
  }
  return positions_of(owner, cp_size);
}

LayoutPositions plan_balanced_positions(const std::vector<std::int64_t>& slot_lens,
                                        std::int64_t padded_len, int cp_size) {
  if (cp_size == 1)
    return positions_of(std::vector<int>(static_cast<std::size_t>(padded_len), 0), 1);
  // The attention documents: nonzero slots in row order, then the row tail.
  std::vector<Span> docs;
  std::int64_t start = 0;
  for (const std::int64_t n : slot_lens) {
    if (n > 0) docs.push_back({start, n});
    start += n;
  }
  if (start < padded_len) docs.push_back({start, padded_len - start});
  Books books{std::vector<int>(static_cast<std::size_t>(padded_len), -1),
              std::vector<std::int64_t>(static_cast<std::size_t>(cp_size), 0),
              std::vector<double>(static_cast<std::size_t>(cp_size), 0.0), padded_len / cp_size};
  const std::int64_t two_cp = 2 * static_cast<std::int64_t>(cp_size);
  std::vector<Span> short_docs;
  for (const Span& doc : docs) {
    if (doc.length < two_cp * kMinChunkTokens) {
      short_docs.push_back(doc);
      continue;
    }
    // Long: 2 CP chunks of floor(n / 2CP) tokens; the extra tokens go to the ranks with the
    // fewest tokens before this document (first chunks, then second chunks).
    std::vector<int> by_tokens;
    for (int r = 0; r < cp_size; ++r) by_tokens.push_back(r);
    std::stable_sort(by_tokens.begin(), by_tokens.end(), [&](int a, int b) {
      return books.tokens[static_cast<std::size_t>(a)] < books.tokens[static_cast<std::size_t>(b)];
    });
    std::vector<std::int64_t> chunk(static_cast<std::size_t>(two_cp), doc.length / two_cp);
    for (std::int64_t k = 0; k < doc.length % two_cp; ++k) {
      const int r = by_tokens[static_cast<std::size_t>(k % cp_size)];
      const std::int64_t c = k < cp_size ? r : two_cp - 1 - r;  // its first or second chunk
      chunk[static_cast<std::size_t>(c)] += 1;
    }
    std::int64_t offset = 0;
    for (std::int64_t c = 0; c < two_cp; ++c) {
      const int r = static_cast<int>(c < cp_size ? c : two_cp - 1 - c);
      books.assign(r, doc, offset, offset + chunk[static_cast<std::size_t>(c)]);
      offset += chunk[static_cast<std::size_t>(c)];
    }
  }
  // Short: longest first (row order among equals), whole to the least-loaded rank with room.
  std::stable_sort(short_docs.begin(), short_docs.end(),
                   [](const Span& a, const Span& b) { return a.length > b.length; });
  for (const Span& doc : short_docs) {
    int chosen = -1;
    for (int r = 0; r < cp_size; ++r)
      if (books.room(r) >= doc.length &&
          (chosen == -1 ||
           books.work[static_cast<std::size_t>(r)] < books.work[static_cast<std::size_t>(chosen)]))
        chosen = r;
    if (chosen != -1) {
      books.assign(chosen, doc, 0, doc.length);
      continue;
    }
    // No rank has room for all of it: cut in row order, the roomiest rank first.
    std::int64_t offset = 0;
    while (offset < doc.length) {
      int roomiest = 0;
      for (int r = 1; r < cp_size; ++r)
        if (books.room(r) > books.room(roomiest)) roomiest = r;
      const std::int64_t take = std::min(books.room(roomiest), doc.length - offset);
      books.assign(roomiest, doc, offset, offset + take);
      offset += take;
    }
  }
  return positions_of(books.owner, cp_size);
}

}  // namespace cpkit::reference
