// SPEC 6 items 1, 2, 3 and 7: the optimized Sharder, run in real rank processes, equals the
// reference rank by rank, bit for bit; gathering its shards back gives the reference's
// global streams; shard_primary=false + cut_spliced equals shard_primary=true.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "tasks.hpp"

namespace cpkit::harness {
namespace {

using reference::harness::gen_bshd_case;
using reference::harness::gen_packed_case;
using reference::harness::make_batch;
using reference::harness::options_of;

void check_rank(const pool::Bundle& b, const reference::Sharder& ref,
                const reference::Sharder& eager, int m, int r) {
  const std::string key = std::to_string(m) + ".";
  const std::string where =
      " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
  const reference::LocalShard local = ref.local(m, r);
  const reference::GlobalStreams& g = ref.global(m);
  require_same(b.get(key + "labels"), to_tensor(local.labels), "labels" + where);
  require_same(b.get(key + "position_ids"), to_tensor(local.position_ids), "positions" + where);
  require_same(b.get(key + "document_ids"), to_tensor(local.document_ids), "documents" + where);
  require_same(b.get(key + "padding"), to_tensor(local.padding), "padding" + where);
  require_same(b.get(key + "valid"), to_tensor(local.valid), "valid" + where);
  // Shard then gather is the identity on every stream.
  require_same(b.get(key + "gathered.labels"), to_tensor(g.labels), "gathered labels" + where);
  require_same(b.get(key + "gathered.position_ids"), to_tensor(g.position_ids),
               "gathered positions" + where);
  require_same(b.get(key + "gathered.document_ids"), to_tensor(g.document_ids),
               "gathered documents" + where);
  require_same(b.get(key + "gathered.padding"), to_tensor(g.padding), "gathered padding" + where);
  if (ref.options().shard_primary) {
    if (local.input_ids)
      require_same(b.get(key + "input_ids"), to_tensor(*local.input_ids), "ids" + where);
    if (local.inputs_embeds) {
      require_same(b.get(key + "inputs_embeds"), to_tensor(*local.inputs_embeds), "embeds" + where);
      require_same(b.get(key + "gathered.inputs_embeds"), to_tensor(*g.inputs_embeds),
                   "gathered embeds" + where);
    }
  } else {
    // The in-forward cut equals the eager shard of shard_primary=true.
    const reference::LocalShard e = eager.local(m, r);
    const at::Tensor expected = e.input_ids ? to_tensor(*e.input_ids) : to_tensor(*e.inputs_embeds);
    require_same(b.get(key + "cut"), expected, "in-forward cut" + where);
  }
  if (g.cu_seqlens.size() > 0) {
    require_same(b.get(key + "cu_seqlens"), to_tensor(g.cu_seqlens), "cu_seqlens" + where);
    require_same(b.get(key + "cu_seqlens_padded"), to_tensor(g.cu_seqlens_padded),
                 "cu_seqlens_padded" + where);
  }
}

template <class Case, class Prepare>
void check_case(const Case& c, const std::string& task, Prepare prepare) {
  const reference::Sharder ref = prepare(c);
  Case eager_case = c;
  eager_case.shard_primary = true;
  const reference::Sharder eager = prepare(eager_case);
  const auto bundles = bundles_of(pool::RankPool::instance().run(c.cp, task, encode(c)), task);
  for (int m = 0; m < ref.num_microbatches(); ++m)
    for (int r = 0; r < c.cp; ++r) check_rank(bundles[r], ref, eager, m, r);
}

void check_bshd(const BshdCase& c) {
  check_case(c, kShardBshd, [](const BshdCase& k) {
    return reference::prepare_cp_inputs(make_batch(k), options_of(k));
  });
}

void check_packed(const PackedCase& c) {
  check_case(c, kShardPacked, [](const PackedCase& k) {
    return reference::prepare_packed_cp_inputs(make_batch(k), options_of(k));
  });
}

RC_GTEST_PROP(OptimizedSharding, BshdEqualsReferenceRankByRank, ()) {
  check_bshd(*gen_bshd_case());
}

RC_GTEST_PROP(OptimizedSharding, ThdEqualsReferenceRankByRank, ()) {
  check_packed(*gen_packed_case());
}

// Failure class: positions recomputed after the cut (explicit position_ids, CP >= 2).
RC_GTEST_PROP(OptimizedSharding, PositionsComeFromTheGlobalSequence, ()) {
  BshdCase c = *gen_bshd_case();
  c.cp = *rc::gen::inRange(2, 9);
  c.seq_len = *rc::gen::inRange(c.cp, 40);
  check_bshd(c);
}

// Failure class: packed positions that do not restart per document.
RC_GTEST_PROP(OptimizedSharding, PackedPositionsRestartPerDocument, ()) {
  PackedCase c = *gen_packed_case();
  c.rows[0].insert(c.rows[0].begin(), {*rc::gen::inRange(1, 9), 0});  // a later document exists
  check_packed(c);
}

// Failure class: padding assumed at the row tail only (slot padding inside the row).
RC_GTEST_PROP(OptimizedSharding, SlotPaddingIsPadding, ()) {
  PackedCase c = *gen_packed_case();
  c.rows[0].insert(c.rows[0].begin(), {*rc::gen::inRange(1, 6), *rc::gen::inRange(1, 4)});
  check_packed(c);
}

// Failure class: shard_primary=false diverging from shard_primary=true.
RC_GTEST_PROP(OptimizedSharding, ShardPrimaryFalseEqualsTrue, ()) {
  BshdCase b = *gen_bshd_case();
  b.shard_primary = false;
  b.cp = *rc::gen::inRange(2, 9);
  check_bshd(b);
  PackedCase p = *gen_packed_case();
  p.shard_primary = false;
  p.cp = b.cp;
  check_packed(p);
}

}  // namespace
}  // namespace cpkit::harness
