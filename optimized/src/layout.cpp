// The layout planners (docs/spec.md section 2b).
#include "cpkit/optimized/layout.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "cpkit/optimized/error.hpp"

namespace cpkit {

namespace {

// Tokens per chunk below which a document is not cut head-tail (spec 2b step 2).
constexpr std::int64_t kMinChunk = 64;
// The query and key tile of the balanced plan's cost model (spec 2b step 3).
constexpr std::int64_t kBalanceTile = 128;

void check_plan_args(std::int64_t seq_len, int cp_size, int pad_multiple) {
  if (cp_size < 1) raise("cp_size", "must be >= 1, got ", cp_size);
  if (pad_multiple < 1) raise("pad_multiple", "must be >= 1, got ", pad_multiple);
  if (seq_len < 1) raise("seq_len", "must be >= 1, got ", seq_len);
}

LayoutPlan empty_plan(LayoutKind kind, std::int64_t seq_len, int cp_size, int pad_multiple) {
  LayoutPlan plan;
  plan.kind = kind;
  plan.cp_size = cp_size;
  plan.seq_len = seq_len;
  plan.padded_len = layout_padded_length(kind, seq_len, cp_size, pad_multiple);
  plan.local_len = plan.padded_len / cp_size;
  plan.fragments.resize(static_cast<std::size_t>(cp_size));
  return plan;
}

// Sorts each rank's fragments by begin and merges adjacent ones.
void normalise(LayoutPlan& plan) {
  for (auto& list : plan.fragments) {
    std::sort(list.begin(), list.end(),
              [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });
    std::vector<Fragment> merged;
    for (const Fragment& f : list) {
      if (f.size() == 0) continue;
      if (!merged.empty() && merged.back().end == f.begin)
        merged.back().end = f.end;
      else
        merged.push_back(f);
    }
    list = std::move(merged);
  }
}

// Work of doc offsets [a, e): sum of (offset + 1).
double span_work(std::int64_t a, std::int64_t e) {
  return 0.5 * static_cast<double>(e - a) * static_cast<double>(a + e + 1);
}

// The balanced planner's running state: per rank, tokens, work and fragments.
struct Ranks {
  std::vector<std::int64_t> tokens;
  std::vector<double> work;
  LayoutPlan* plan;

  void give(int rank, std::int64_t doc_start, std::int64_t a, std::int64_t e) {
    if (e <= a) return;
    const auto r = static_cast<std::size_t>(rank);
    plan->fragments[r].push_back({doc_start + a, doc_start + e});
    tokens[r] += e - a;
    work[r] += span_work(a, e);
  }
  std::int64_t room(int rank) const {
    return plan->local_len - tokens[static_cast<std::size_t>(rank)];
  }
};

struct Document {
  std::int64_t start, length;
};

// Step 2's head-tail cut of a document over `chosen`: chunk sizes per chosen rank (first,
// second chunk), the extra tokens to the chosen ranks with the fewest tokens so far.
struct Cut {
  std::vector<int> chosen;
  std::vector<std::int64_t> head, tail;
};

Cut head_tail_sizes(const Ranks& ranks, std::int64_t n, std::vector<int> chosen) {
  const auto g = static_cast<std::int64_t>(chosen.size());
  const std::int64_t q = n / (2 * g), extra = n % (2 * g);
  std::vector<std::size_t> order(chosen.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranks.tokens[static_cast<std::size_t>(chosen[a])] <
           ranks.tokens[static_cast<std::size_t>(chosen[b])];
  });
  Cut cut{std::move(chosen), std::vector<std::int64_t>(order.size(), q), {}};
  cut.tail = cut.head;
  for (std::int64_t k = 0; k < extra; ++k)
    (k < g ? cut.head : cut.tail)[order[static_cast<std::size_t>(k % g)]] += 1;
  return cut;
}

void give_cut(Ranks& ranks, const Document& d, const Cut& cut) {
  const auto g = static_cast<std::int64_t>(cut.chosen.size());
  std::int64_t offset = 0;
  for (std::int64_t c = 0; c < 2 * g; ++c) {
    const auto j = static_cast<std::size_t>(c < g ? c : 2 * g - 1 - c);
    const std::int64_t size = (c < g ? cut.head : cut.tail)[j];
    ranks.give(cut.chosen[j], d.start, offset, offset + size);
    offset += size;
  }
}

// A document whole to the least-worked rank with room, else cut in row order by room.
void place_whole(Ranks& ranks, const Document& d, int cp) {
  int best = -1;
  for (int r = 0; r < cp; ++r)
    if (ranks.room(r) >= d.length && (best < 0 || ranks.work[static_cast<std::size_t>(r)] <
                                                      ranks.work[static_cast<std::size_t>(best)]))
      best = r;
  if (best >= 0) {
    ranks.give(best, d.start, 0, d.length);
    return;
  }
  std::int64_t offset = 0;
  while (offset < d.length) {
    int most = 0;
    for (int r = 1; r < cp; ++r)
      if (ranks.room(r) > ranks.room(most)) most = r;
    const std::int64_t take = std::min(ranks.room(most), d.length - offset);
    if (take <= 0) raise("seq_lens_padded", "the balanced plan ran out of room (internal error)");
    ranks.give(most, d.start, offset, offset + take);
    offset += take;
  }
}

// A document's cut over g ranks (spec 2b step 2): the g least-worked ranks with room for
// 2 floor(n / 2g) tokens, if each has room for its chunks; else g grows. None: keep it whole.
std::optional<Cut> cut_over(const Ranks& ranks, const Document& d, std::int64_t g, int cp) {
  for (; g >= 2 && g <= cp; ++g) {
    const std::int64_t need = 2 * (d.length / (2 * g));
    std::vector<int> fit;
    for (int r = 0; r < cp; ++r)
      if (ranks.room(r) >= need) fit.push_back(r);
    if (static_cast<std::int64_t>(fit.size()) < g) continue;
    std::stable_sort(fit.begin(), fit.end(), [&](int a, int b) {
      return ranks.work[static_cast<std::size_t>(a)] < ranks.work[static_cast<std::size_t>(b)];
    });
    fit.resize(static_cast<std::size_t>(g));
    Cut cut = head_tail_sizes(ranks, d.length, std::move(fit));
    bool fits = true;
    for (std::size_t j = 0; j < cut.chosen.size(); ++j)
      fits = fits && ranks.room(cut.chosen[j]) >= cut.head[j] + cut.tail[j];
    if (fits) return cut;
  }
  return std::nullopt;
}

// How many ranks a document is cut over first: min(CP, n / piece), or with piece 0 every
// rank for n >= 2 CP * kMinChunk, else one.
std::int64_t group_size(const Document& d, std::int64_t piece, int cp) {
  if (piece > 0) return std::clamp<std::int64_t>(d.length / piece, 1, cp);
  return d.length >= 2 * cp * kMinChunk ? cp : 1;
}

// One candidate: documents longest first, each over group_size ranks.
LayoutPlan plan_candidate(const LayoutPlan& empty, const std::vector<Document>& by_length,
                          std::int64_t piece) {
  LayoutPlan plan = empty;
  const int cp = plan.cp_size;
  Ranks ranks{std::vector<std::int64_t>(static_cast<std::size_t>(cp), 0),
              std::vector<double>(static_cast<std::size_t>(cp), 0.0), &plan};
  for (const Document& d : by_length) {
    const std::int64_t g = group_size(d, piece, cp);
    const std::optional<Cut> cut = g >= 2 ? cut_over(ranks, d, g, cp) : std::nullopt;
    if (cut)
      give_cut(ranks, d, *cut);
    else
      place_whole(ranks, d, cp);
  }
  normalise(plan);
  return plan;
}

double max_over_mean(const std::vector<double>& cost) {
  const double sum = std::accumulate(cost.begin(), cost.end(), 0.0);
  return *std::max_element(cost.begin(), cost.end()) / (sum / static_cast<double>(cost.size()));
}

}  // namespace

LayoutKind layout_kind(const std::string& name) {
  if (name == "contiguous") return LayoutKind::kContiguous;
  if (name == "head_tail") return LayoutKind::kHeadTail;
  if (name == "balanced") return LayoutKind::kBalanced;
  raise("layout", "must be \"contiguous\", \"head_tail\" or \"balanced\", got \"", name, "\"");
}

const char* layout_name(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kContiguous:
      return "contiguous";
    case LayoutKind::kHeadTail:
      return "head_tail";
    case LayoutKind::kBalanced:
      return "balanced";
  }
  return "?";
}

std::int64_t layout_padded_length(LayoutKind kind, std::int64_t seq_len, int cp_size,
                                  int pad_multiple) {
  if (cp_size == 1) return seq_len;
  const std::int64_t chunks = kind == LayoutKind::kHeadTail ? 2 * cp_size : cp_size;
  const std::int64_t multiple = chunks * pad_multiple;
  return (seq_len + multiple - 1) / multiple * multiple;
}

LayoutPlan plan_layout(LayoutKind kind, std::int64_t seq_len, int cp_size, int pad_multiple) {
  check_plan_args(seq_len, cp_size, pad_multiple);
  if (kind == LayoutKind::kBalanced)
    raise("layout", "\"balanced\" plans packed (THD) rows from their document lengths");
  LayoutPlan plan = empty_plan(kind, seq_len, cp_size, pad_multiple);
  const std::int64_t L = plan.local_len;
  for (int r = 0; r < cp_size; ++r) {
    auto& list = plan.fragments[static_cast<std::size_t>(r)];
    if (kind == LayoutKind::kContiguous || cp_size == 1) {
      list.push_back({r * L, (r + 1) * L});
    } else {
      const std::int64_t C = L / 2;
      list.push_back({r * C, (r + 1) * C});
      list.push_back({(2 * cp_size - 1 - r) * C, (2 * cp_size - r) * C});
    }
  }
  normalise(plan);
  return plan;
}

void check_balance_slack(double balance_slack) {
  if (!(balance_slack >= 0) || !std::isfinite(balance_slack))
    raise("balance_slack", "must be finite and >= 0, got ", balance_slack);
}

LayoutPlan plan_balanced(const std::vector<std::int64_t>& slot_lens, std::int64_t seq_len,
                         int cp_size, int pad_multiple, double balance_slack) {
  check_plan_args(seq_len, cp_size, pad_multiple);
  check_balance_slack(balance_slack);
  LayoutPlan plan = empty_plan(LayoutKind::kBalanced, seq_len, cp_size, pad_multiple);
  if (cp_size == 1) {
    plan.fragments[0].push_back({0, plan.padded_len});
    return plan;
  }
  // Step 1: the attention documents (nonzero slots, then the row tail).
  std::vector<Document> docs;
  std::vector<std::int64_t> lens;
  std::int64_t start = 0;
  for (const std::int64_t len : slot_lens) {
    if (len < 0) raise("seq_lens_padded", "must be >= 0, got ", len);
    if (len > 0) docs.push_back({start, len});
    start += len;
  }
  if (start > plan.seq_len)
    raise("seq_lens_padded", "slots sum to ", start, " but the row holds ", plan.seq_len,
          " tokens");
  if (start < plan.padded_len) docs.push_back({start, plan.padded_len - start});
  for (const Document& d : docs) lens.push_back(d.length);
  std::stable_sort(docs.begin(), docs.end(),
                   [](const Document& a, const Document& b) { return a.length > b.length; });
  // Step 3: candidates from the fewest cuts (pieces of 2L / k, k = 2, 3, ... down to
  // 2 * kMinChunk, then every rank); the first whose work and tile cost are within the slack,
  // else the most even. A piece that gives every document the same rank count as the one
  // before gives the same plan: skipped.
  const std::int64_t L = plan.local_len;
  std::vector<std::int64_t> pieces;
  for (std::int64_t k = 2; 2 * L / k >= 2 * kMinChunk; ++k) pieces.push_back(2 * L / k);
  pieces.push_back(0);
  LayoutPlan best;
  double best_ratio = 0;
  std::vector<std::int64_t> groups, last_groups;
  for (const std::int64_t piece : pieces) {
    groups.clear();
    for (const Document& d : docs) groups.push_back(group_size(d, piece, cp_size));
    if (groups == last_groups) continue;
    last_groups = groups;
    LayoutPlan candidate = plan_candidate(plan, docs, piece);
    const double ratio = std::max(max_over_mean(layout_work(candidate, lens)),
                                  max_over_mean(layout_work(candidate, lens, kBalanceTile)));
    if (ratio <= 1 + balance_slack) return candidate;
    if (best.fragments.empty() || ratio < best_ratio) {
      best = std::move(candidate);
      best_ratio = ratio;
    }
  }
  return best;
}

std::vector<std::int64_t> layout_positions(const LayoutPlan& plan, int rank) {
  if (rank < 0 || rank >= plan.cp_size)
    raise("rank", "must be in [0, ", plan.cp_size, "), got ", rank);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(plan.local_len));
  for (const Fragment& f : plan.fragments[static_cast<std::size_t>(rank)])
    for (std::int64_t t = f.begin; t < f.end; ++t) out.push_back(t);
  return out;
}

std::vector<std::int64_t> restore_index(const LayoutPlan& plan) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(plan.padded_len));
  for (int q = 0; q < plan.cp_size; ++q) {
    const std::vector<std::int64_t> positions = layout_positions(plan, q);
    for (std::size_t j = 0; j < positions.size(); ++j)
      index[static_cast<std::size_t>(positions[j])] = q * plan.local_len + static_cast<int64_t>(j);
  }
  return index;
}

std::vector<double> layout_work(const LayoutPlan& plan, const std::vector<std::int64_t>& doc_lens,
                                std::int64_t tile) {
  if (tile < 1) raise("tile", "must be >= 1, got ", tile);
  std::vector<std::int64_t> starts{0};
  for (const std::int64_t n : doc_lens) starts.push_back(starts.back() + n);
  if (starts.back() != plan.padded_len)
    raise("doc_lens", "sum to ", starts.back(), " but the plan covers ", plan.padded_len);
  std::vector<double> work(static_cast<std::size_t>(plan.cp_size), 0.0);
  for (int r = 0; r < plan.cp_size; ++r)
    for (const Fragment& f : plan.fragments[static_cast<std::size_t>(r)]) {
      // The fragment's pieces, one per attention document it touches.
      auto doc = std::upper_bound(starts.begin(), starts.end(), f.begin) - starts.begin() - 1;
      for (std::int64_t t = f.begin; t < f.end; ++doc) {
        const std::int64_t s = starts[static_cast<std::size_t>(doc)];
        const std::int64_t e = std::min(f.end, starts[static_cast<std::size_t>(doc) + 1]);
        // Query tiles of `tile` rows from t - s; each sees keys up to its last query.
        for (std::int64_t a = t - s; a < e - s; a += tile) {
          const std::int64_t last = std::min(a + tile, e - s);
          const std::int64_t key_tiles = (last + tile - 1) / tile;
          work[static_cast<std::size_t>(r)] +=
              tile == 1 ? static_cast<double>(last) : static_cast<double>(key_tiles * tile * tile);
        }
        t = e;
      }
    }
  return work;
}

}  // namespace cpkit
