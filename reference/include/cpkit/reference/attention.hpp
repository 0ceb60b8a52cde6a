// A small masked-attention consumer (single head, one batch row) that proves gradient
// transport end to end: local queries attend to gathered keys/values under the SPEC 3 mask,
// and dK/dV travel back through gather_tokens_backward.
#pragma once

#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

// What travels with every key so that the mask stays exact across shards.
struct TokenMeta {
  IntVector position;
  IntVector document;
  BoolVector padding;
};

// The ranks' metadata in rank order (what a gather of it gives every rank).
TokenMeta concatenate_meta(const std::vector<TokenMeta>& metas);

// SPEC 3: q may attend to k iff doc(q) > 0, doc(q) == doc(k), pos(k) <= pos(q), k not padding.
bool attention_allowed(const TokenMeta& queries, Eigen::Index q, const TokenMeta& keys,
                       Eigen::Index k);

struct AttentionGrads {
  FloatMatrix dq, dk, dv;
};

// softmax(mask(q k^T / sqrt(d))) v; a query with no allowed key yields a zero row.
FloatMatrix masked_attention(const FloatMatrix& q, const FloatMatrix& k, const FloatMatrix& v,
                             const TokenMeta& q_meta, const TokenMeta& k_meta);
AttentionGrads masked_attention_backward(const FloatMatrix& q, const FloatMatrix& k,
                                         const FloatMatrix& v, const TokenMeta& q_meta,
                                         const TokenMeta& k_meta, const FloatMatrix& d_out);

// One rank's local tensors of one batch row: q, k, v are [L, d].
struct RankAttention {
  FloatMatrix q, k, v;
  TokenMeta meta;
};

// CP forward: each rank gathers keys, values and their metadata, then attends locally.
std::vector<FloatMatrix> cp_attention(const std::vector<RankAttention>& ranks);
// CP backward: dQ stays local; each rank's dK/dV over the gathered keys is reduce-scattered
// back onto the owning ranks.
std::vector<AttentionGrads> cp_attention_backward(const std::vector<RankAttention>& ranks,
                                                  const std::vector<FloatMatrix>& d_out);

// FlashAttention's varlen attention (causal, bottom-right alignment), single head: segment
// i's queries q[cu_q[i], cu_q[i + 1]) (m of them) attend keys k[cu_k[i], cu_k[i + 1]) (n of
// them); query a of the segment sees keys j <= a + n - m. A query with no key (n < m) gives
// a zero row. Segments may hold no query (they skip keys).
FloatMatrix varlen_attention(const FloatMatrix& q, const FloatMatrix& k, const FloatMatrix& v,
                             const IntVector& cu_q, const IntVector& cu_k);
AttentionGrads varlen_attention_backward(const FloatMatrix& q, const FloatMatrix& k,
                                         const FloatMatrix& v, const IntVector& cu_q,
                                         const IntVector& cu_k, const FloatMatrix& d_out);

}  // namespace cpkit::reference
