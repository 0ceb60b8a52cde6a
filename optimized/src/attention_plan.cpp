// Needed keys per (receiver, owner): key j of document d at position p is needed by rank r
// when one of r's queries of document d has a position in [p, p + W) (or >= p without a
// window). Per row and document, each rank's query positions sorted once; each key is then
// one binary search per receiving rank.
#include "cpkit/optimized/attention_plan.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "cpkit/optimized/error.hpp"

namespace cpkit {

namespace {

// One rank's tokens of one row: (document, position, padding), host copies.
struct RowMeta {
  std::vector<std::int64_t> document, position;
  std::vector<bool> padding;
};

std::vector<RowMeta> row_meta(const LocalShard& l) {
  const at::Tensor doc = l.document_ids.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor pos = l.position_ids.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor pad = l.padding.to(at::kCPU).to(at::kBool).contiguous();
  const std::int64_t rows = doc.size(0), L = doc.size(1);
  std::vector<RowMeta> out(static_cast<std::size_t>(rows));
  for (std::int64_t b = 0; b < rows; ++b) {
    RowMeta& m = out[static_cast<std::size_t>(b)];
    const std::int64_t* d = doc.const_data_ptr<std::int64_t>() + b * L;
    const std::int64_t* p = pos.const_data_ptr<std::int64_t>() + b * L;
    const bool* f = pad.const_data_ptr<bool>() + b * L;
    m.document.assign(d, d + L);
    m.position.assign(p, p + L);
    m.padding.assign(f, f + L);
  }
  return out;
}

// Sorted query positions of one rank's row, by document (documents > 0 only: the others see
// nothing, section 3).
std::map<std::int64_t, std::vector<std::int64_t>> queries_by_document(const RowMeta& m) {
  std::map<std::int64_t, std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < m.document.size(); ++i)
    if (m.document[i] > 0) out[m.document[i]].push_back(m.position[i]);
  for (auto& [doc, positions] : out) std::sort(positions.begin(), positions.end());
  return out;
}

// Whether a query position in `sorted` lies in [p, p + window) ([p, inf) for window 0).
bool seen_by(const std::vector<std::int64_t>& sorted, std::int64_t p, std::int64_t window) {
  const auto first = std::lower_bound(sorted.begin(), sorted.end(), p);
  return first != sorted.end() && (window == 0 || *first - p < window);
}

using Group = std::vector<std::pair<std::int64_t, std::int64_t>>;       // (position, slot)
using Groups = std::map<std::pair<std::int64_t, std::int64_t>, Group>;  // by (row, document)

// Every non-padding key slot of a document > 0 (local, then received) grouped by (row,
// document), each group sorted by position: built once, filtered per key index.
Groups group_keys(const AttentionPlan& plan, const std::vector<std::vector<RowMeta>>& meta) {
  const std::int64_t L = plan.local_len;
  Groups groups;
  auto add = [&](int owner, std::int64_t local, std::int64_t slot) {
    const RowMeta& m = meta[static_cast<std::size_t>(owner)][static_cast<std::size_t>(local / L)];
    const auto j = static_cast<std::size_t>(local % L);
    if (!m.padding[j] && m.document[j] > 0)
      groups[{local / L, m.document[j]}].emplace_back(m.position[j], slot);
  };
  for (std::int64_t i = 0; i < plan.rows * L; ++i) add(plan.rank, i, i);
  std::int64_t slot = plan.rows * L;
  for (int o = 0; o < plan.cp_size; ++o)
    for (const std::int64_t local : plan.recv[static_cast<std::size_t>(o)]) add(o, local, slot++);
  for (auto& [key, keys] : groups) std::sort(keys.begin(), keys.end());
  return groups;
}

// A key index (attention_plan.hpp) over the local slots, the received ones, or both: the
// grouped keys kept by the filter, and each local query's range in them.
KeyIndex index_keys(const AttentionPlan& plan, const std::vector<RowMeta>& queries,
                    const Groups& every, bool own, bool remote) {
  const std::int64_t L = plan.local_len;
  const auto keep = [&](std::int64_t slot) { return slot < plan.rows * L ? own : remote; };
  Groups groups;
  for (const auto& [key, keys] : every) {
    Group kept;
    for (const auto& entry : keys)
      if (keep(entry.second)) kept.push_back(entry);
    if (!kept.empty()) groups.emplace(key, std::move(kept));
  }
  KeyIndex index;
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> group_start;
  for (const auto& [key, keys] : groups) {
    group_start[key] = static_cast<std::int64_t>(index.slots.size());
    for (const auto& entry : keys) index.slots.push_back(entry.second);
  }
  index.begin.assign(static_cast<std::size_t>(plan.rows * L), 0);
  index.end.assign(static_cast<std::size_t>(plan.rows * L), 0);
  constexpr std::int64_t kLowest = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kHighest = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t i = 0; i < plan.rows * L; ++i) {
    const RowMeta& m = queries[static_cast<std::size_t>(i / L)];
    const auto j = static_cast<std::size_t>(i % L);
    const auto found = groups.find({i / L, m.document[j]});
    if (m.document[j] <= 0 || found == groups.end()) continue;
    const Group& keys = found->second;
    const std::int64_t p = m.position[j];
    const std::int64_t lowest = plan.window > 0 ? p - plan.window + 1 : kLowest;
    const auto first = std::lower_bound(keys.begin(), keys.end(), std::pair{lowest, kLowest});
    const auto last =
        std::max(first, std::upper_bound(keys.begin(), keys.end(), std::pair{p, kHighest}));
    const std::int64_t start = group_start[found->first];
    index.begin[static_cast<std::size_t>(i)] = start + (first - keys.begin());
    index.end[static_cast<std::size_t>(i)] = start + (last - keys.begin());
  }
  return index;
}

}  // namespace

std::int64_t AttentionPlan::received_keys() const {
  std::int64_t total = 0;
  for (const auto& list : recv) total += static_cast<std::int64_t>(list.size());
  return total;
}

AttentionPlan attention_plan(const Sharder& sharder, int microbatch, int rank, std::int64_t window,
                             KeyExchange keys_moved) {
  if (window < 0) raise("window", "must be >= 0 (0: no window), got ", window);
  const int cp = sharder.cp_size();
  if (rank < 0 || rank >= cp) raise("rank", "must be in [0, ", cp, "), got ", rank);
  std::vector<std::vector<RowMeta>> meta;  // [owner][row]
  for (int o = 0; o < cp; ++o) meta.push_back(row_meta(sharder.local(microbatch, o)));
  AttentionPlan plan;
  plan.cp_size = cp;
  plan.rank = rank;
  plan.rows = static_cast<std::int64_t>(meta[0].size());
  plan.local_len = plan.rows > 0 ? static_cast<std::int64_t>(meta[0][0].document.size()) : 0;
  plan.window = window;
  plan.send.resize(static_cast<std::size_t>(cp));
  plan.recv.resize(static_cast<std::size_t>(cp));
  // Every rank's sorted query positions by document, per row: once each.
  std::vector<std::vector<std::map<std::int64_t, std::vector<std::int64_t>>>> queries(
      static_cast<std::size_t>(cp));
  for (int q = 0; q < cp; ++q)
    for (const RowMeta& m : meta[static_cast<std::size_t>(q)])
      queries[static_cast<std::size_t>(q)].push_back(queries_by_document(m));
  // needed(receiver, owner) for the pairs this rank takes part in.
  auto needed = [&](int receiver, int owner, std::vector<std::int64_t>& out) {
    for (std::int64_t b = 0; b < plan.rows; ++b) {
      const RowMeta& keys = meta[static_cast<std::size_t>(owner)][static_cast<std::size_t>(b)];
      const auto& by_document =
          queries[static_cast<std::size_t>(receiver)][static_cast<std::size_t>(b)];
      for (std::size_t j = 0; j < keys.document.size(); ++j) {
        if (keys_moved == KeyExchange::kAll) {
          out.push_back(b * plan.local_len + static_cast<std::int64_t>(j));
          continue;
        }
        if (keys.padding[j]) continue;  // padding keys are never seen
        const auto found = by_document.find(keys.document[j]);
        if (found != by_document.end() && seen_by(found->second, keys.position[j], window))
          out.push_back(b * plan.local_len + static_cast<std::int64_t>(j));
      }
    }
  };
  for (int o = 0; o < cp; ++o) {
    if (o == rank) continue;
    needed(o, rank, plan.send[static_cast<std::size_t>(o)]);
    needed(rank, o, plan.recv[static_cast<std::size_t>(o)]);
  }
  const Groups every = group_keys(plan, meta);
  const std::vector<RowMeta>& mine = meta[static_cast<std::size_t>(rank)];
  plan.all_keys = index_keys(plan, mine, every, true, true);
  plan.own_keys = index_keys(plan, mine, every, true, false);
  plan.remote_keys = index_keys(plan, mine, every, false, true);
  return plan;
}

}  // namespace cpkit
