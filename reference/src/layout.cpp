// Layouts (SPEC 2b), token by token: an owner per global position, then each rank's list.
#include "cpkit/reference/layout.hpp"

#include <algorithm>
#include <cmath>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

namespace {

// A document is cut head-tail only into chunks of at least this many tokens.
constexpr std::int64_t kMinChunkTokens = 64;
// The query and key tile of the balanced plan's cost model (a flash-attention block).
constexpr std::int64_t kBalanceTile = 128;

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

namespace {

// One candidate plan (SPEC 2b step 2): every document, longest first, to g ranks.
std::vector<int> plan_candidate(const std::vector<Span>& docs, std::int64_t padded_len, int cp_size,
                                std::int64_t piece) {
  Books books{std::vector<int>(static_cast<std::size_t>(padded_len), -1),
              std::vector<std::int64_t>(static_cast<std::size_t>(cp_size), 0),
              std::vector<double>(static_cast<std::size_t>(cp_size), 0.0), padded_len / cp_size};
  std::vector<Span> order = docs;
  std::stable_sort(order.begin(), order.end(),
                   [](const Span& a, const Span& b) { return a.length > b.length; });
  for (const Span& doc : order) {
    std::int64_t g = piece > 0 ? std::clamp<std::int64_t>(doc.length / piece, 1, cp_size)
                     : doc.length >= 2 * cp_size * kMinChunkTokens ? cp_size
                                                                   : 1;
    // The g least-worked ranks with room for 2 floor(n / 2g) tokens, cut head-tail over them
    // if each has room for its chunks; else one more rank (up to CP).
    bool placed = false;
    for (; g >= 2 && g <= cp_size && !placed; ++g) {
      std::vector<int> chosen;
      for (int r = 0; r < cp_size; ++r)
        if (books.room(r) >= 2 * (doc.length / (2 * g))) chosen.push_back(r);
      if (static_cast<std::int64_t>(chosen.size()) < g) continue;
      std::stable_sort(chosen.begin(), chosen.end(), [&](int a, int b) {
        return books.work[static_cast<std::size_t>(a)] < books.work[static_cast<std::size_t>(b)];
      });
      chosen.resize(static_cast<std::size_t>(g));
      // Chunk j and 2g-1-j to chosen[j]; the extra tokens to the chosen ranks with the fewest
      // tokens so far (first chunks, then second chunks).
      std::vector<int> by_tokens = chosen;
      std::stable_sort(by_tokens.begin(), by_tokens.end(), [&](int a, int b) {
        return books.tokens[static_cast<std::size_t>(a)] <
               books.tokens[static_cast<std::size_t>(b)];
      });
      std::vector<std::int64_t> chunk(static_cast<std::size_t>(2 * g), doc.length / (2 * g));
      for (std::int64_t k = 0; k < doc.length % (2 * g); ++k) {
        const int r = by_tokens[static_cast<std::size_t>(k % g)];
        const auto j = std::find(chosen.begin(), chosen.end(), r) - chosen.begin();
        chunk[static_cast<std::size_t>(k < g ? j : 2 * g - 1 - j)] += 1;
      }
      bool fits = true;
      for (std::int64_t j = 0; j < g; ++j)
        fits = fits && books.room(chosen[static_cast<std::size_t>(j)]) >=
                           chunk[static_cast<std::size_t>(j)] +
                               chunk[static_cast<std::size_t>(2 * g - 1 - j)];
      if (!fits) continue;
      std::int64_t offset = 0;
      for (std::int64_t c = 0; c < 2 * g; ++c) {
        const int r = chosen[static_cast<std::size_t>(c < g ? c : 2 * g - 1 - c)];
        books.assign(r, doc, offset, offset + chunk[static_cast<std::size_t>(c)]);
        offset += chunk[static_cast<std::size_t>(c)];
      }
      placed = true;
    }
    if (placed) continue;
    // Whole, to the least-worked rank with room.
    int best = -1;
    for (int r = 0; r < cp_size; ++r)
      if (books.room(r) >= doc.length &&
          (best == -1 ||
           books.work[static_cast<std::size_t>(r)] < books.work[static_cast<std::size_t>(best)]))
        best = r;
    if (best != -1) {
      books.assign(best, doc, 0, doc.length);
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
  return books.owner;
}

// Max over mean of the ranks' attention cost (SPEC 2b step 1): per token (tile 1) or per
// tile: each run of a rank's tokens inside one document, in query tiles of `tile` from the
// run's start; a tile ending at document offset e costs ceil(e / tile) * tile * tile.
double imbalance(const std::vector<int>& owner, const std::vector<Span>& docs, int cp_size,
                 std::int64_t tile) {
  std::vector<double> cost(static_cast<std::size_t>(cp_size), 0.0);
  for (const Span& doc : docs) {
    std::int64_t a = 0;
    while (a < doc.length) {
      const int r = owner[static_cast<std::size_t>(doc.start + a)];
      std::int64_t e = a;
      while (e < doc.length && owner[static_cast<std::size_t>(doc.start + e)] == r) ++e;
      for (std::int64_t t = a; t < e; t += tile) {
        const std::int64_t last = std::min(t + tile, e);
        cost[static_cast<std::size_t>(r)] +=
            static_cast<double>((last + tile - 1) / tile * tile * tile);
      }
      a = e;
    }
  }
  double most = 0, sum = 0;
  for (const double c : cost) {
    most = std::max(most, c);
    sum += c;
  }
  return most / (sum / cp_size);
}

}  // namespace

LayoutPositions plan_balanced_positions(const std::vector<std::int64_t>& slot_lens,
                                        std::int64_t padded_len, int cp_size,
                                        double balance_slack) {
  if (!(balance_slack >= 0) || !std::isfinite(balance_slack))
    raise("balance_slack", "must be finite and >= 0, got ", balance_slack);
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
  // Candidates from the fewest cuts: pieces of 2L / k tokens for k = 2, 3, ... (while >= 2 *
  // 64), then every rank for each document of >= 2 CP * 64. The first whose work and tile
  // cost are both within the slack wins, else the most even of them all.
  std::vector<std::int64_t> pieces;
  const std::int64_t L = padded_len / cp_size;
  for (std::int64_t k = 2; 2 * L / k >= 2 * kMinChunkTokens; ++k) pieces.push_back(2 * L / k);
  pieces.push_back(0);
  std::vector<int> best;
  double best_ratio = 0;
  for (const std::int64_t piece : pieces) {
    std::vector<int> owner = plan_candidate(docs, padded_len, cp_size, piece);
    const double ratio =
        std::max(imbalance(owner, docs, cp_size, 1), imbalance(owner, docs, cp_size, kBalanceTile));
    if (ratio <= 1 + balance_slack) return positions_of(owner, cp_size);
    if (best.empty() || ratio < best_ratio) {
      best = std::move(owner);
      best_ratio = ratio;
    }
  }
  return positions_of(best, cp_size);
}

}  // namespace cpkit::reference
