// cpkit's context-parallel attention (docs/spec.md section 4b), the oracle: every rank's
// output, log-sum-exp and gradients computed in double from every key of the row under the
// mask, and, independently, the keys each rank needs from each other rank. One batch row;
// heads as one [L, D] matrix per head.
#pragma once

#include <cstdint>
#include <vector>

#include "cpkit/reference/attention.hpp"
#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

struct AttentionOptions {
  double scale = 0.0;         // 0: 1 / sqrt(D)
  std::int64_t window = 0;    // W > 0: a query sees keys with pos(q) - pos(k) < W
  double softcap = 0.0;       // c > 0: scores c * tanh(s / c)
  std::vector<double> sinks;  // one logit per query head, or empty
};

// One rank's tokens of one row: one [L, D] matrix per query head (q) and per key head (k, v);
// the number of query heads is a multiple of the number of key heads (GQA).
struct RankHeads {
  std::vector<FloatMatrix> q, k, v;
  TokenMeta meta;
};

struct HeadsOutput {
  std::vector<FloatMatrix> out;     // per query head, [L, D]
  std::vector<Vector<double>> lse;  // per query head, [L]; -inf where nothing is seen
};

struct HeadsGrads {
  std::vector<FloatMatrix> dq, dk, dv;  // like q, k, v: this rank's own tokens
  std::vector<double> dsinks;           // this rank's term, per query head (empty: no sinks)
};

// Section 3's mask with the window: may query i (of `queries`) see key j (of `keys`)?
bool attention_visible(const TokenMeta& queries, Eigen::Index i, const TokenMeta& keys,
                       Eigen::Index j, std::int64_t window);

// needed[r][o]: the local indices (o's order, ascending) of o's tokens that some query of r
// may see; empty for o == r.
using NeededKeys = std::vector<std::vector<std::vector<Eigen::Index>>>;
NeededKeys needed_keys(const std::vector<TokenMeta>& ranks, std::int64_t window);

// Every rank's attention over the whole row's keys (rank order), and its backward: dq on the
// rank itself, dk and dv summed over every rank's queries onto the key's owner.
std::vector<HeadsOutput> cp_attention(const std::vector<RankHeads>& ranks,
                                      const AttentionOptions& options);
std::vector<HeadsGrads> cp_attention_backward(const std::vector<RankHeads>& ranks,
                                              const std::vector<std::vector<FloatMatrix>>& d_out,
                                              const AttentionOptions& options);

}  // namespace cpkit::reference
