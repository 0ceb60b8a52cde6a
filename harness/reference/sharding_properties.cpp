// docs/spec.md sections 2, 2b and 3 for the reference: shard then gather is the identity, every
// rank's metadata is the global metadata cut, and shard_primary=false + in-forward cut == true.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

template <class Scalar>
bool same(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && a == b;
}

// Gathers one stream of every rank back along the sequence axis.
template <class Scalar, class Pick>
Matrix<Scalar> regather(const Sharder& s, int m, Pick pick) {
  std::vector<Matrix<Scalar>> parts;
  for (int r = 0; r < s.options().cp_size; ++r) parts.push_back(pick(s.local(m, r)));
  return gather_sequence(parts);
}

void check_layout(const Sharder& s, int m) {
  const auto& g = s.global(m);
  const auto multiple = std::int64_t{s.options().cp_size} * s.options().pad_multiple;
  if (s.options().cp_size == 1) {
    RC_ASSERT(g.padded_len == g.seq_len);  // CP = 1: the identity on layout, no padding
  } else {
    RC_ASSERT(g.padded_len % multiple == 0);
    RC_ASSERT(g.padded_len >= g.seq_len);
    RC_ASSERT(g.padded_len - g.seq_len < multiple);
  }
  for (int r = 0; r < s.options().cp_size; ++r) {
    const Layout l = s.layout(m, r);
    RC_ASSERT(l.begin == r * l.local_len);
    RC_ASSERT(l.end - l.begin == l.local_len);
    RC_ASSERT(l.local_len * s.options().cp_size == g.padded_len);
  }
}

// Every stream gathered back equals the global streams; nothing lost, duplicated, reordered.
void check_round_trip(const Sharder& s) {
  for (int m = 0; m < s.num_microbatches(); ++m) {
    check_layout(s, m);
    const GlobalStreams& g = s.global(m);
    RC_ASSERT(
        same(regather<std::int64_t>(s, m, [](const LocalShard& l) { return l.labels; }), g.labels));
    RC_ASSERT(same(regather<std::int64_t>(s, m, [](const LocalShard& l) { return l.position_ids; }),
                   g.position_ids));
    RC_ASSERT(same(regather<std::int64_t>(s, m, [](const LocalShard& l) { return l.document_ids; }),
                   g.document_ids));
    RC_ASSERT(same(regather<bool>(s, m, [](const LocalShard& l) { return l.padding; }), g.padding));
    RC_ASSERT(same(regather<bool>(s, m,
                                  [](const LocalShard& l) {
                                    return BoolMatrix(l.valid.reshaped<Eigen::RowMajor>(
                                        l.labels.rows(), l.labels.cols()));
                                  }),
                   g.valid));
    if (s.options().shard_primary && g.input_ids)
      RC_ASSERT(same(regather<std::int64_t>(s, m, [](const LocalShard& l) { return *l.input_ids; }),
                     *g.input_ids));
    if (s.options().shard_primary && g.inputs_embeds)
      for (std::size_t b = 0; b < g.inputs_embeds->size(); ++b) {
        std::vector<FloatMatrix> parts;
        for (int r = 0; r < s.options().cp_size; ++r)
          parts.push_back((*s.local(m, r).inputs_embeds)[b]);
        RC_ASSERT(same(gather_tokens(parts), (*g.inputs_embeds)[b]));
      }
  }
}

// The padded global streams hold the input unchanged on real tokens.
void check_input_preserved(const Sharder& s, const IntMatrix& labels,
                           const std::optional<IntMatrix>& ids, Eigen::Index rows_per_mb) {
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const GlobalStreams& g = s.global(m);
    for (Eigen::Index b = 0; b < g.labels.rows(); ++b)
      for (Eigen::Index t = 0; t < g.padded_len; ++t) {
        const auto row = m * rows_per_mb + b;
        if (t >= g.seq_len) {
          RC_ASSERT(g.padding(b, t));
          if (ids && s.options().shard_primary)
            RC_ASSERT((*g.input_ids)(b, t) == s.options().pad_token_id);
        } else {
          if (ids) RC_ASSERT((*g.input_ids)(b, t) == (*ids)(row, t));
          RC_ASSERT(g.labels(b, t) == (g.padding(b, t) ? kIgnoreLabel : labels(row, t)));
        }
        RC_ASSERT(g.valid(b, t) == (!g.padding(b, t) && g.labels(b, t) != kIgnoreLabel && t > 0 &&
                                    (g.cu_seqlens.size() == 0 || g.position_ids(b, t) > 0)));
      }
  }
}

RC_GTEST_PROP(ReferenceSharding, BshdShardThenGatherIsIdentity, ()) {
  const BshdCase c = *gen_bshd_case();
  const BshdBatch batch = make_batch(c);
  const Sharder s = prepare_cp_inputs(batch, options_of(c));
  RC_ASSERT(s.num_microbatches() == c.num_chunks);
  RC_ASSERT(s.images().size() == batch.images.size());
  RC_ASSERT(s.images()[0].values == batch.images[0].values);
  check_round_trip(s);
  check_input_preserved(s, batch.labels, batch.input_ids, c.rows_per_chunk);
}

RC_GTEST_PROP(ReferenceSharding, ThdShardThenGatherIsIdentity, ()) {
  const PackedCase c = *gen_packed_case();
  const PackedBatch batch = make_batch(c);
  const Sharder s = prepare_packed_cp_inputs(batch, options_of(c));
  RC_ASSERT(s.num_microbatches() == static_cast<int>(c.rows.size()));
  check_round_trip(s);
  check_input_preserved(s, batch.labels, batch.input_ids, 1);
}

RC_GTEST_PROP(ReferenceSharding, BshdPositionsAreGlobalPositionsCut, ()) {
  const BshdCase c = *gen_bshd_case();
  const BshdBatch batch = make_batch(c);
  const Sharder s = prepare_cp_inputs(batch, options_of(c));
  for (int m = 0; m < s.num_microbatches(); ++m)
    for (int r = 0; r < c.cp; ++r) {
      const LocalShard l = s.local(m, r);
      for (Eigen::Index b = 0; b < l.labels.rows(); ++b)
        for (Eigen::Index j = 0; j < l.layout.local_len; ++j) {
          const auto t = l.layout.begin + j;  // global column
          const auto row = m * c.rows_per_chunk + b;
          const auto S = c.seq_len;
          // Expected, from the input alone: the given position, continued past the end.
          const std::int64_t last = batch.position_ids ? (*batch.position_ids)(row, S - 1) : S - 1;
          const std::int64_t expected =
              t < S ? (batch.position_ids ? (*batch.position_ids)(row, t) : t) : last + (t - S + 1);
          RC_ASSERT(l.position_ids(b, j) == expected);
          const bool masked = t < S && batch.attention_mask && (*batch.attention_mask)(row, t) == 0;
          RC_ASSERT(l.padding(b, j) == (t >= S || masked));
          RC_ASSERT(l.document_ids(b, j) == (t < S ? 1 : 0));
        }
    }
}

// Expected packed metadata built document by document (not token by token, as cpkit does).
struct PackedExpectation {
  std::vector<std::int64_t> position, document;
  std::vector<bool> padding;
};

PackedExpectation expected_packed(const std::vector<Doc>& docs, std::int64_t padded_len) {
  PackedExpectation e;
  std::int64_t id = 0;
  for (const Doc& d : docs) {
    ++id;
    for (int i = 0; i < d.length + d.extra; ++i) {
      e.position.push_back(i);
      e.document.push_back(id);
      e.padding.push_back(i >= d.length);
    }
  }
  while (static_cast<std::int64_t>(e.position.size()) < padded_len) {
    e.position.push_back(0);
    e.document.push_back(0);
    e.padding.push_back(true);
  }
  return e;
}

RC_GTEST_PROP(ReferenceSharding, ThdMetadataIsGlobalMetadataCut, ()) {
  const PackedCase c = *gen_packed_case();
  const Sharder s = prepare_packed_cp_inputs(make_batch(c), options_of(c));
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const PackedExpectation e = expected_packed(c.rows[m], s.global(m).padded_len);
    std::int64_t cu = 0, cu_padded = 0;
    for (std::size_t d = 0; d < c.rows[m].size(); ++d) {
      cu += c.rows[m][d].length;
      cu_padded += c.rows[m][d].length + c.rows[m][d].extra;
      RC_ASSERT(s.global(m).cu_seqlens(static_cast<Eigen::Index>(d) + 1) == cu);
      RC_ASSERT(s.global(m).cu_seqlens_padded(static_cast<Eigen::Index>(d) + 1) == cu_padded);
    }
    for (int r = 0; r < c.cp; ++r) {
      const LocalShard l = s.local(m, r);
      for (Eigen::Index j = 0; j < l.layout.local_len; ++j) {
        const auto t = static_cast<std::size_t>(l.layout.begin + j);
        RC_ASSERT(l.position_ids(0, j) == e.position[t]);
        RC_ASSERT(l.document_ids(0, j) == e.document[t]);
        RC_ASSERT(l.padding(0, j) == e.padding[t]);
        if (e.padding[t]) RC_ASSERT(l.labels(0, j) == kIgnoreLabel);
      }
    }
  }
}

// shard_primary=false keeps the primary global; cutting it in forward must equal the
// shard_primary=true shard bit for bit, and the cut's backward must place gradients back.
template <class Case, class Prepare>
void check_in_forward_cut(Case c, Prepare prepare) {
  c.shard_primary = true;
  const Sharder eager = prepare(c);
  c.shard_primary = false;
  const Sharder lazy = prepare(c);
  for (int m = 0; m < eager.num_microbatches(); ++m) {
    const GlobalStreams& g = lazy.global(m);
    RC_ASSERT(g.seq_len == eager.global(m).seq_len);
    std::vector<FloatRows> grads_per_rank;
    for (int r = 0; r < c.cp; ++r) {
      const LocalShard e = eager.local(m, r);
      const LocalShard l = lazy.local(m, r);
      RC_ASSERT(!l.input_ids && !l.inputs_embeds);
      RC_ASSERT(same(l.labels, e.labels) && same(l.position_ids, e.position_ids));
      RC_ASSERT(same(l.padding, e.padding) && same(l.document_ids, e.document_ids));
      RC_ASSERT(l.valid == e.valid);
      if (g.input_ids) {
        RC_ASSERT(g.input_ids->cols() == g.seq_len);  // kept global and unpadded
        RC_ASSERT(same(lazy.cut_ids(m, r, *g.input_ids), *e.input_ids));
      }
      if (g.inputs_embeds) {
        const FloatRows cut = lazy.cut_spliced(m, r, *g.inputs_embeds);
        for (std::size_t b = 0; b < cut.size(); ++b) RC_ASSERT(same(cut[b], (*e.inputs_embeds)[b]));
        // Backward: rank r's gradient comes back exactly on its own global rows.
        FloatRows grad_local;
        for (std::size_t b = 0; b < cut.size(); ++b)
          grad_local.push_back(FloatMatrix::Constant(cut[b].rows(), cut[b].cols(), r + 1.0f));
        const FloatRows back = lazy.cut_spliced_backward(m, r, grad_local);
        const Layout lay = lazy.layout(m, r);
        for (std::size_t b = 0; b < back.size(); ++b)
          for (Eigen::Index t = 0; t < back[b].rows(); ++t)
            RC_ASSERT((back[b].row(t).array() == (t >= lay.begin && t < lay.end ? r + 1.0f : 0.0f))
                          .all());
      }
    }
  }
}

RC_GTEST_PROP(ReferenceSharding, BshdShardPrimaryFalseEqualsTrue, ()) {
  check_in_forward_cut(*gen_bshd_case(), [](const BshdCase& c) {
    return prepare_cp_inputs(make_batch(c), options_of(c));
  });
}

RC_GTEST_PROP(ReferenceSharding, ThdShardPrimaryFalseEqualsTrue, ()) {
  check_in_forward_cut(*gen_packed_case(), [](const PackedCase& c) {
    return prepare_packed_cp_inputs(make_batch(c), options_of(c));
  });
}

// CP = 1 is the identity on layout whatever pad_multiple asks: no padding token, every stream
// as long as the input, ids unchanged (docs/spec.md section 1).
RC_GTEST_PROP(ReferenceSharding, Cp1IsIdentityOnLayout, ()) {
  BshdCase b = *gen_bshd_case();
  b.cp = 1;
  const BshdBatch bshd = make_batch(b);
  const Sharder sb = prepare_cp_inputs(bshd, options_of(b));
  for (int m = 0; m < sb.num_microbatches(); ++m) {
    const LocalShard l = sb.local(m, 0);
    RC_ASSERT(l.layout.padded_len == b.seq_len);
    RC_ASSERT(l.labels.cols() == b.seq_len);
    if (l.input_ids)
      RC_ASSERT(*l.input_ids == bshd.input_ids->middleRows(m * b.rows_per_chunk, b.rows_per_chunk));
    RC_ASSERT(!l.padding.any() || bshd.attention_mask.has_value());
  }
  PackedCase p = *gen_packed_case();
  p.cp = 1;
  const PackedBatch packed = make_batch(p);
  const Sharder sp = prepare_packed_cp_inputs(packed, options_of(p));
  for (int m = 0; m < sp.num_microbatches(); ++m) {
    const LocalShard l = sp.local(m, 0);
    RC_ASSERT(l.layout.padded_len == packed.labels.cols());
    if (l.input_ids) RC_ASSERT(*l.input_ids == packed.input_ids->middleRows(m, 1));
  }
}

}  // namespace
}  // namespace cpkit::harness
