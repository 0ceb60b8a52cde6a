// Greedy runs: a query whose range repeats in the next query opens a full sequence; any
// other opens a causal one, extended while each next query's range ends one slot later and
// starts where the bottom-right window puts it.
#include "attention_runs.hpp"

#include <algorithm>
#include <limits>
#include <tuple>

namespace cpkit::detail {

namespace {

// Queries [first_query, first_query + count) against the slots [keys_begin, keys_end).
void add_sequence(VarlenBatch& batch, std::int64_t first_query, std::int64_t count,
                  std::vector<std::int64_t>::const_iterator keys_begin,
                  std::vector<std::int64_t>::const_iterator keys_end) {
  for (std::int64_t i = first_query; i < first_query + count; ++i) batch.queries.push_back(i);
  batch.key_slots.insert(batch.key_slots.end(), keys_begin, keys_end);
  batch.cu_q.push_back(static_cast<std::int32_t>(batch.queries.size()));
  batch.cu_k.push_back(static_cast<std::int32_t>(batch.key_slots.size()));
  batch.max_q = std::max(batch.max_q, count);
  batch.max_k = std::max<std::int64_t>(batch.max_k, keys_end - keys_begin);
}

// Flash's offsets are int32: a batch past that is left to cpkit's own kernel, and so is one
// that would copy keys out more than twice over plus a window per sequence (a document's
// prefix per piece adds up quadratically).
bool fits(const VarlenBatch& batch, std::size_t slots, std::int64_t window) {
  const std::size_t sequences = batch.cu_q.size() - 1;
  return batch.key_slots.size() <=
             2 * slots + batch.queries.size() + sequences * static_cast<std::size_t>(window) &&
         batch.key_slots.size() <
             static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
}

}  // namespace

std::optional<VarlenRuns> varlen_runs(const KeyIndex& index, std::int64_t window) {
  const auto& begin = index.begin;
  const auto& end = index.end;
  const auto slots = static_cast<std::int64_t>(index.slots.size());
  const auto n = static_cast<std::int64_t>(begin.size());
  if (static_cast<std::int64_t>(end.size()) != n) return std::nullopt;
  VarlenRuns runs;
  runs.left = window > 0 ? window - 1 : -1;
  // Where query j of a causal run from b0 must start, c = nk - nq.
  auto causal_begin = [&](std::int64_t b0, std::int64_t c, std::int64_t j) {
    return runs.left < 0 ? b0 : b0 + std::max<std::int64_t>(0, j + c - runs.left);
  };
  for (std::int64_t i = 0; i < n;) {
    const std::int64_t b = begin[i], e = end[i];
    if (b < 0 || b > e || e > slots) return std::nullopt;
    if (b == e) {  // sees nothing: no sequence (flash would give it a +inf log-sum-exp)
      ++i;
      continue;
    }
    std::int64_t j = i + 1;
    while (j < n && begin[j] == b && end[j] == e) ++j;
    if (j - i >= 2) {
      add_sequence(runs.full, i, j - i, index.slots.begin() + b, index.slots.begin() + e);
      i = j;
      continue;
    }
    const std::int64_t c = e - b - 1;
    if (causal_begin(b, c, 0) != b) return std::nullopt;  // more keys than the window holds
    for (j = i + 1; j < n && end[j] == end[j - 1] + 1 && end[j] <= slots &&
                    begin[j] == causal_begin(b, c, j - i);
         ++j) {
    }
    add_sequence(runs.causal, i, j - i, index.slots.begin() + b, index.slots.begin() + end[j - 1]);
    i = j;
  }
  if (!fits(runs.causal, index.slots.size(), window) ||
      !fits(runs.full, index.slots.size(), window))
    return std::nullopt;
  return runs;
}

std::pair<VarlenRuns, VarlenRuns> split_at_slot(const VarlenRuns& runs, std::int64_t first_remote) {
  std::pair<VarlenRuns, VarlenRuns> out;
  out.first.left = out.second.left = runs.left;
  for (const auto& [from, own, other] :
       {std::tuple{&runs.causal, &out.first.causal, &out.second.causal},
        {&runs.full, &out.first.full, &out.second.full}}) {
    for (std::size_t i = 0; i + 1 < from->cu_q.size(); ++i) {
      const auto keys_begin = from->key_slots.begin() + from->cu_k[i];
      const auto keys_end = from->key_slots.begin() + from->cu_k[i + 1];
      VarlenBatch& to =
          std::all_of(keys_begin, keys_end, [&](std::int64_t slot) { return slot < first_remote; })
              ? *own
              : *other;
      add_sequence(to, from->queries[static_cast<std::size_t>(from->cu_q[i])],
                   from->cu_q[i + 1] - from->cu_q[i], keys_begin, keys_end);
    }
  }
  return out;
}

std::optional<FlashStages> flash_stages(const AttentionPlan& plan) {
  if (plan.window == 0) {
    auto own = varlen_runs(plan.own_keys, 0), received = varlen_runs(plan.remote_keys, 0);
    if (own && received) return FlashStages{std::move(*own), std::move(*received), true};
  }
  const auto all = varlen_runs(plan.all_keys, plan.window);
  if (!all) return std::nullopt;
  auto [first, second] = split_at_slot(*all, plan.rows * plan.local_len);
  return FlashStages{std::move(first), std::move(second), false};
}

}  // namespace cpkit::detail
