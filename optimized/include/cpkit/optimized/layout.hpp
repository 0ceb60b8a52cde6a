// Layouts (docs/spec.md section 2b): which global token positions each CP rank owns. The
// one place that knows where a token lives; every op reads fragments from here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cpkit {

enum class LayoutKind { kContiguous, kHeadTail, kBalanced };

// "contiguous", "head_tail" or "balanced"; anything else raises, naming `layout`.
LayoutKind layout_kind(const std::string& name);
const char* layout_name(LayoutKind kind);

// Global padded positions [begin, end).
struct Fragment {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

// One sequence's plan for the whole CP group: rank r's local tokens are fragments[r]
// concatenated (sorted by begin, adjacent ones merged); each rank owns local_len tokens.
struct LayoutPlan {
  LayoutKind kind = LayoutKind::kContiguous;
  int cp_size = 1;
  std::int64_t seq_len = 0;                      // S (or T) as given
  std::int64_t padded_len = 0;                   // S_pad
  std::int64_t local_len = 0;                    // L = S_pad / CP
  std::vector<std::vector<Fragment>> fragments;  // [rank][k]
};

// S_pad of a kind: S at CP = 1; else the next multiple of CP * pad_multiple (contiguous,
// balanced) or 2 * CP * pad_multiple (head_tail) at or above S.
std::int64_t layout_padded_length(LayoutKind kind, std::int64_t seq_len, int cp_size,
                                  int pad_multiple);

// contiguous and head_tail depend on the length alone.
LayoutPlan plan_layout(LayoutKind kind, std::int64_t seq_len, int cp_size, int pad_multiple = 1);
// How far above 1 a balanced plan's work and tile cost max / mean may be for it to cut fewer
// documents (spec 2b; chosen from bench/layout_bench.cpp).
inline constexpr double kDefaultBalanceSlack = 0.02;

// Raises naming `balance_slack` unless it is finite and >= 0 (plan_balanced's check, and
// every preparation's, whatever its layout).
void check_balance_slack(double balance_slack);

// balanced: from one packed row's slot lengths (seq_lens_padded without sentinels); the plan
// with the fewest cut documents whose work and tile cost max / mean are within
// 1 + balance_slack.
LayoutPlan plan_balanced(const std::vector<std::int64_t>& slot_lens, std::int64_t seq_len,
                         int cp_size, int pad_multiple = 1,
                         double balance_slack = kDefaultBalanceSlack);

// The global position of each of rank's local tokens, in local order.
std::vector<std::int64_t> layout_positions(const LayoutPlan& plan, int rank);

// For each global position g in [0, padded_len): its index in the rank-order concatenation
// of every rank's local tokens (what gather_tokens returns), so that
// gathered[restore_index[g]] is token g: restore_order's permutation.
std::vector<std::int64_t> restore_index(const LayoutPlan& plan);

// Causal attention work of each rank (spec 2b step 1's work summed over its tokens) for a
// row whose attention documents have these lengths (covering [0, padded_len) in order); and
// the same rounded up to whole tiles of `tile` queries by `tile` keys per fragment.
std::vector<double> layout_work(const LayoutPlan& plan, const std::vector<std::int64_t>& doc_lens,
                                std::int64_t tile = 1);

}  // namespace cpkit
