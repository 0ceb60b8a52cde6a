// Varlen attention offsets (docs/spec.md section 4a) for the reference: a FlashAttention-style
// kernel driven by them equals the masked CP attention on every rank (output on real
// queries, dQ, dK, dV), and the offsets are well formed and cover exactly the keys the mask
// allows.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

// Both sides compute in double from the same float inputs and round once to float.
constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;

struct RowInputs {
  FloatMatrix q, k, v, d_out;  // [S_pad, head] over the global row
};

RowInputs row_inputs(const GlobalStreams& g, Eigen::Index b, int head, std::uint64_t seed, int m) {
  const auto T = g.padded_len;
  const std::int64_t index = m * 1024 + b;
  RowInputs in{random_floats(T, head, 1, input_seed(seed, Input::kQuery, index)),
               random_floats(T, head, 1, input_seed(seed, Input::kKey, index)),
               random_floats(T, head, 1, input_seed(seed, Input::kValue, index)),
               random_floats(T, head, 1, input_seed(seed, Input::kAttentionGrad, index))};
  // Padding queries' outputs are unspecified under varlen: nothing may flow back from them.
  for (Eigen::Index t = 0; t < T; ++t)
    if (g.padding(b, t)) in.d_out.row(t).setZero();
  return in;
}

TokenMeta meta_of(const GlobalStreams& g, Eigen::Index b, std::int64_t begin, std::int64_t n) {
  return {g.position_ids.row(b).segment(begin, n).transpose(),
          g.document_ids.row(b).segment(begin, n).transpose(),
          g.padding.row(b).segment(begin, n).transpose()};
}

void require_close(const FloatMatrix& actual, const FloatMatrix& expected,
                   const std::string& what) {
  const std::string diff = mismatch(actual, expected, kAtol, kRtol);
  if (!diff.empty()) RC_FAIL(what + ": " + diff);
}

// The offsets' own invariants, and that each segment's keys are its fragment's document
// prefix: every key a real query may attend to, nothing a real query may not.
void check_offsets(const GlobalStreams& g, const Layout& l, const AttentionOffsets& o) {
  const auto rows = g.labels.rows(), F = o.cu_seqlens_q.size() - 1;
  const auto width = o.k_end - o.k_begin;
  RC_ASSERT(o.cu_seqlens_q.size() == o.cu_seqlens_k.size());
  RC_ASSERT(o.cu_seqlens_q(0) == 0 && o.cu_seqlens_k(0) == 0);
  RC_ASSERT(o.cu_seqlens_q(F) == rows * l.local_len);
  RC_ASSERT(o.cu_seqlens_k(F) == rows * width);
  RC_ASSERT(o.k_end == l.end && o.k_begin <= l.begin && o.k_begin >= 0);
  std::int64_t max_q = 0, max_k = 0;
  for (Eigen::Index i = 0; i < F; ++i) {
    const auto q0 = o.cu_seqlens_q(i), q1 = o.cu_seqlens_q(i + 1);
    const auto k0 = o.cu_seqlens_k(i), k1 = o.cu_seqlens_k(i + 1);
    RC_ASSERT(q1 >= q0 && k1 - k0 >= q1 - q0);  // every query sees at least itself
    max_q = std::max(max_q, q1 - q0);
    max_k = std::max(max_k, k1 - k0);
    if (q1 == q0) continue;
    const auto b = q0 / l.local_len;
    RC_ASSERT((q1 - 1) / l.local_len == b && (k1 - 1) / width == b && k0 / width == b);
    const auto first_key = o.k_begin + (k0 - b * width), end_key = o.k_begin + (k1 - b * width);
    RC_ASSERT(end_key == l.begin + (q1 - b * l.local_len));  // ends at its last query
    const TokenMeta row = meta_of(g, b, 0, g.padded_len);
    for (auto q = q0; q < q1; ++q) {
      const auto t = l.begin + (q - b * l.local_len);
      if (row.padding(t)) continue;
      for (std::int64_t j = 0; j < g.padded_len; ++j) {
        const bool in_segment = j >= first_key && j <= t;  // bottom-right causal
        const bool allowed = attention_allowed(row, t, row, j);
        // Allowed keys are all visible; visible keys a real query may not attend to do not
        // exist (padding keys of the document come after its real tokens).
        RC_ASSERT(allowed == in_segment);
      }
    }
  }
  RC_ASSERT(max_q == o.max_seqlen_q && max_k == o.max_seqlen_k);
}

void check_microbatch(const Sharder& s, int m, int head, std::uint64_t seed) {
  const GlobalStreams& g = s.global(m);
  const int cp = s.options().cp_size;
  const auto rows = g.labels.rows(), T = g.padded_len;
  std::vector<RowInputs> in;
  std::vector<std::vector<FloatMatrix>> masked_out;
  std::vector<std::vector<AttentionGrads>> masked_grads;
  for (Eigen::Index b = 0; b < rows; ++b) {
    in.push_back(row_inputs(g, b, head, seed, m));
    std::vector<RankAttention> ranks;
    std::vector<FloatMatrix> d_out;
    for (int r = 0; r < cp; ++r) {
      const Layout l = s.layout(m, r);
      const auto cut = [&](const FloatMatrix& x) {
        return FloatMatrix(x.middleRows(l.begin, l.local_len));
      };
      ranks.push_back(
          {cut(in[b].q), cut(in[b].k), cut(in[b].v), meta_of(g, b, l.begin, l.local_len)});
      d_out.push_back(cut(in[b].d_out));
    }
    masked_out.push_back(cp_attention(ranks));
    masked_grads.push_back(cp_attention_backward(ranks, d_out));
  }
  std::vector<FloatMatrix> dk(rows, FloatMatrix::Zero(T, head)), dv = dk;
  for (int r = 0; r < cp; ++r) {
    const Layout l = s.layout(m, r);
    const AttentionOffsets o = attention_offsets(s, m, r);
    check_offsets(g, l, o);
    const auto L = l.local_len, W = o.k_end - o.k_begin;
    FloatMatrix q(rows * L, head), d_out(rows * L, head), keys(rows * W, head), values = keys;
    for (Eigen::Index b = 0; b < rows; ++b) {
      q.middleRows(b * L, L) = in[b].q.middleRows(l.begin, L);
      d_out.middleRows(b * L, L) = in[b].d_out.middleRows(l.begin, L);
      keys.middleRows(b * W, W) = in[b].k.middleRows(o.k_begin, W);
      values.middleRows(b * W, W) = in[b].v.middleRows(o.k_begin, W);
    }
    const FloatMatrix out = varlen_attention(q, keys, values, o.cu_seqlens_q, o.cu_seqlens_k);
    const AttentionGrads grads =
        varlen_attention_backward(q, keys, values, o.cu_seqlens_q, o.cu_seqlens_k, d_out);
    const std::string on = " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r);
    for (Eigen::Index b = 0; b < rows; ++b) {
      const std::string where = on + ", row " + std::to_string(b) + ")";
      FloatMatrix real_out = out.middleRows(b * L, L), expected = masked_out[b][r];
      for (Eigen::Index j = 0; j < L; ++j)
        if (g.padding(b, l.begin + j)) real_out.row(j) = expected.row(j);  // unspecified
      require_close(real_out, expected, "output on real queries" + where);
      require_close(grads.dq.middleRows(b * L, L), masked_grads[b][r].dq, "dQ" + where);
      dk[b].middleRows(o.k_begin, W) += grads.dk.middleRows(b * W, W);
      dv[b].middleRows(o.k_begin, W) += grads.dv.middleRows(b * W, W);
    }
  }
  // dK/dV summed over the ranks that used each key (the reduce-scatter) = each owner's.
  for (Eigen::Index b = 0; b < rows; ++b)
    for (int r = 0; r < cp; ++r) {
      const Layout l = s.layout(m, r);
      const std::string where = " (row " + std::to_string(b) + ", owner " + std::to_string(r) + ")";
      require_close(dk[b].middleRows(l.begin, l.local_len), masked_grads[b][r].dk, "dK" + where);
      require_close(dv[b].middleRows(l.begin, l.local_len), masked_grads[b][r].dv, "dV" + where);
    }
}

// Rows `positions` of x, in that order.
FloatMatrix pick(const FloatMatrix& x, const std::vector<std::int64_t>& positions) {
  FloatMatrix out(static_cast<Eigen::Index>(positions.size()), x.cols());
  for (std::size_t j = 0; j < positions.size(); ++j)
    out.row(static_cast<Eigen::Index>(j)) = x.row(positions[j]);
  return out;
}

TokenMeta meta_at(const GlobalStreams& g, Eigen::Index b, const std::vector<std::int64_t>& at) {
  TokenMeta meta{IntVector(static_cast<Eigen::Index>(at.size())),
                 IntVector(static_cast<Eigen::Index>(at.size())),
                 BoolVector(static_cast<Eigen::Index>(at.size()))};
  for (std::size_t j = 0; j < at.size(); ++j) {
    const auto i = static_cast<Eigen::Index>(j);
    meta.position(i) = g.position_ids(b, at[j]);
    meta.document(i) = g.document_ids(b, at[j]);
    meta.padding(i) = g.padding(b, at[j]);
  }
  return meta;
}

// Layouts (SPEC 2b, 4a): keys picked from the rank-order gathered keys by k_index; the
// kernel's output, dQ, and dK/dV summed back onto each key's owner equal masked attention.
void check_layout_microbatch(const Sharder& s, int m, int head, std::uint64_t seed) {
  const GlobalStreams& g = s.global(m);
  const int cp = s.options().cp_size;
  const auto rows = g.labels.rows(), T = g.padded_len, L = T / cp, W = T;  // W = CP * L
  std::vector<RowInputs> in;
  std::vector<std::vector<FloatMatrix>> masked_out;
  std::vector<std::vector<AttentionGrads>> masked_grads;
  FloatMatrix gathered_k(rows * W, head), gathered_v(rows * W, head);
  std::vector<std::int64_t> position_of(static_cast<std::size_t>(W));  // rank-order index
  for (int r = 0; r < cp; ++r) {
    const Layout l = s.layout(m, r);
    for (Eigen::Index j = 0; j < L; ++j)
      position_of[static_cast<std::size_t>(r * L + j)] = l.positions[static_cast<std::size_t>(j)];
  }
  for (Eigen::Index b = 0; b < rows; ++b) {
    in.push_back(row_inputs(g, b, head, seed, m));
    std::vector<RankAttention> ranks;
    std::vector<FloatMatrix> d_out;
    for (int r = 0; r < cp; ++r) {
      const std::vector<std::int64_t>& at = s.layout(m, r).positions;
      ranks.push_back({pick(in[b].q, at), pick(in[b].k, at), pick(in[b].v, at), meta_at(g, b, at)});
      d_out.push_back(pick(in[b].d_out, at));
    }
    masked_out.push_back(cp_attention(ranks));
    masked_grads.push_back(cp_attention_backward(ranks, d_out));
    gathered_k.middleRows(b * W, W) = pick(in[b].k, position_of);
    gathered_v.middleRows(b * W, W) = pick(in[b].v, position_of);
  }
  std::vector<FloatMatrix> dk(rows, FloatMatrix::Zero(T, head)), dv = dk;
  for (int r = 0; r < cp; ++r) {
    const Layout l = s.layout(m, r);
    const AttentionOffsets o = attention_offsets(s, m, r);
    const auto K = o.k_index.size(), F = o.cu_seqlens_q.size() - 1;
    RC_ASSERT(o.cu_seqlens_k(F) == K && o.cu_seqlens_q(F) == rows * L);
    FloatMatrix q(rows * L, head), d_out(rows * L, head), keys(K, head), values(K, head);
    for (Eigen::Index b = 0; b < rows; ++b) {
      q.middleRows(b * L, L) = pick(in[b].q, l.positions);
      d_out.middleRows(b * L, L) = pick(in[b].d_out, l.positions);
    }
    for (Eigen::Index i = 0; i < K; ++i) {
      keys.row(i) = gathered_k.row(o.k_index(i));
      values.row(i) = gathered_v.row(o.k_index(i));
    }
    const FloatMatrix out = varlen_attention(q, keys, values, o.cu_seqlens_q, o.cu_seqlens_k);
    const AttentionGrads grads =
        varlen_attention_backward(q, keys, values, o.cu_seqlens_q, o.cu_seqlens_k, d_out);
    const std::string on = " (" + s.options().layout + ", microbatch " + std::to_string(m) +
                           ", rank " + std::to_string(r);
    for (Eigen::Index b = 0; b < rows; ++b) {
      const std::string where = on + ", row " + std::to_string(b) + ")";
      FloatMatrix real_out = out.middleRows(b * L, L), expected = masked_out[b][r];
      for (Eigen::Index j = 0; j < L; ++j)
        if (g.padding(b, l.positions[static_cast<std::size_t>(j)]))
          real_out.row(j) = expected.row(j);  // unspecified
      require_close(real_out, expected, "output on real queries" + where);
      require_close(grads.dq.middleRows(b * L, L), masked_grads[b][r].dq, "dQ" + where);
    }
    for (Eigen::Index i = 0; i < K; ++i) {  // back to the key's row and global position
      const auto b = o.k_index(i) / W, c = o.k_index(i) % W;
      dk[static_cast<std::size_t>(b)].row(position_of[static_cast<std::size_t>(c)]) +=
          grads.dk.row(i);
      dv[static_cast<std::size_t>(b)].row(position_of[static_cast<std::size_t>(c)]) +=
          grads.dv.row(i);
    }
  }
  for (Eigen::Index b = 0; b < rows; ++b)
    for (int r = 0; r < cp; ++r) {
      const std::vector<std::int64_t>& at = s.layout(m, r).positions;
      const std::string where = " (row " + std::to_string(b) + ", owner " + std::to_string(r) + ")";
      require_close(pick(dk[b], at), masked_grads[b][r].dk, "dK" + where);
      require_close(pick(dv[b], at), masked_grads[b][r].dv, "dV" + where);
    }
}

RC_GTEST_PROP(ReferenceOffsets, EveryLayoutVarlenEqualsMaskedCpAttention, ()) {
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.rows[0].push_back({*rc::gen::inRange(0, 300), *rc::gen::inRange(0, 3)});  // long enough to cut
  const int head = *rc::gen::inRange(1, 4);
  const Sharder packed = prepare_packed_cp_inputs(make_batch(p), options_of(p));
  for (int m = 0; m < packed.num_microbatches(); ++m)
    check_layout_microbatch(packed, m, head, p.seed);
  BshdCase b = *gen_attention_bshd_case();
  b.layout = *gen_bshd_layout();
  const Sharder bshd = prepare_cp_inputs(make_batch(b), options_of(b));
  for (int m = 0; m < bshd.num_microbatches(); ++m) check_layout_microbatch(bshd, m, head, b.seed);
}

void check_all(const Sharder& s, std::uint64_t seed) {
  const int head = *rc::gen::inRange(1, 4);
  for (int m = 0; m < s.num_microbatches(); ++m) check_microbatch(s, m, head, seed);
}

RC_GTEST_PROP(ReferenceOffsets, PackedVarlenEqualsMaskedCpAttention, ()) {
  const PackedCase c = *gen_packed_case();
  check_all(prepare_packed_cp_inputs(make_batch(c), options_of(c)), c.seed);
}

RC_GTEST_PROP(ReferenceOffsets, BshdVarlenEqualsMaskedCpAttention, ()) {
  const BshdCase c = *gen_attention_bshd_case();
  check_all(prepare_cp_inputs(make_batch(c), options_of(c)), c.seed);
}

// Masks and positions no varlen offsets can express are named, never approximated.
RC_GTEST_PROP(ReferenceOffsets, InexpressibleMasksAreRejected, ()) {
  BshdCase c = *gen_bshd_case();
  c.use_mask = true;
  c.seq_len = *rc::gen::inRange(3, 30);
  BshdBatch batch = make_batch(c);
  const auto row = *rc::gen::inRange<Eigen::Index>(0, batch.labels.rows());
  const auto hole = *rc::gen::inRange<Eigen::Index>(1, c.seq_len - 1);
  batch.attention_mask->row(row).setOnes();
  (*batch.attention_mask)(row, hole) = 0;  // padding between real tokens
  const Sharder s = prepare_cp_inputs(batch, options_of(c));
  const int m = static_cast<int>(row / c.rows_per_chunk);
  try {
    attention_offsets(s, m, c.cp - 1);  // the last rank sees the whole row
    RC_FAIL("a hole in the mask was accepted");
  } catch (const Error& e) {
    RC_ASSERT(e.argument() == "attention_mask" || e.argument() == "position_ids");
  }
}

}  // namespace
}  // namespace cpkit::harness
