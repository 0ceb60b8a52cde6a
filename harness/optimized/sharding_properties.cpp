// docs/spec.md sections 2, 2b and 3: the optimized Sharder, run in real rank processes, equals the
// reference rank by rank, bit for bit, whatever the strides of the batch it is given
// (a collate's transposed [S, B] tensors, [:, ::2] slices); gathering its shards back gives
// the reference's global streams; shard_primary=false + cut_spliced equals shard_primary=true, and
// the cut's backward (non-contiguous spliced input and upstream gradient) equals the reference's.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/reference/layout.hpp"
#include "layouts.hpp"
#include "rank_task.hpp"

namespace cpkit::harness {
namespace {

using pool::Bundle;

// ---- the rank side ----

// Every stream back in global order ([rows, S_pad, ...] on every rank): restore_order.
void add_shard(Bundle& out, const std::string& key, const LocalShard& s, const MeshPtr& mesh) {
  for (const auto& [name, t] : {std::pair{"labels", s.labels},
                                {"position_ids", s.position_ids},
                                {"document_ids", s.document_ids},
                                {"padding", s.padding}}) {
    out.add(key + name, t);
    out.add(key + "gathered." + name, restore_order(t, s.layout, mesh));
  }
  out.add(key + "valid", s.valid);
  if (s.input_ids.defined()) out.add(key + "input_ids", s.input_ids);
  if (s.inputs_embeds.defined()) {
    out.add(key + "inputs_embeds", s.inputs_embeds);
    out.add(key + "gathered.inputs_embeds", restore_order(s.inputs_embeds, s.layout, mesh));
  }
}

// The upstream gradient of the in-forward cut of microbatch m: [rows, L, H].
reference::FloatRows cut_upstream(std::uint64_t seed, int m, int rank, Eigen::Index rows,
                                  Eigen::Index local_len, Eigen::Index hidden) {
  reference::FloatRows grads;
  for (Eigen::Index b = 0; b < rows; ++b)
    grads.push_back(random_floats(local_len, hidden, 1,
                                  input_seed(seed, Input::kLayout, (m * 64 + rank) * 64 + b)));
  return grads;
}

// shard_primary = false: the cut of a non-contiguous spliced tensor, and its backward with a
// non-contiguous upstream gradient.
void add_cut(Bundle& out, const std::string& key, std::uint64_t seed, const Sharder& sharder, int m,
             MemoryLayout layout) {
  const at::Tensor global = sharder.global_primary(m);
  if (!global.is_floating_point()) {
    out.add(key + "cut", sharder.cut_spliced(m, lay_out(global, strided(layout), -7)));
    return;
  }
  const at::Tensor spliced = lay_out(global, strided(layout), NAN).detach().requires_grad_(true);
  const at::Tensor cut = sharder.cut_spliced(m, spliced);
  out.add(key + "cut", cut);
  const at::Tensor upstream = lay_out(
      to_tensor(cut_upstream(seed, m, sharder.rank(), cut.size(0), cut.size(1), cut.size(2))),
      strided(layout), NAN);
  out.add(key + "cut_grad", torch::autograd::grad({cut}, {spliced}, {upstream})[0]);
}

// Every tensor of the batch with `layout`'s strides (the junk beside sliced values would be
// an error or a wrong shard if read).
CPBatch lay_out_batch(CPBatch b, MemoryLayout layout) {
  for (at::Tensor* t : {&b.input_ids, &b.labels, &b.position_ids, &b.attention_mask, &b.seq_lens,
                        &b.seq_lens_padded})
    if (t->defined()) *t = lay_out(*t, layout, -7);
  if (b.inputs_embeds.defined()) b.inputs_embeds = lay_out(b.inputs_embeds, layout, NAN);
  return b;
}

template <class CaseT>
std::string shard_task(const CaseT& c, const Sharder& sharder, MemoryLayout layout,
                       const MeshPtr& mesh) {
  Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const std::string key = std::to_string(m) + ".";
    add_shard(out, key, sharder.local(m), mesh);
    if (!c.shard_primary) add_cut(out, key, c.seed, sharder, m, layout);
    if constexpr (std::is_same_v<CaseT, PackedCase>) {
      out.add(key + "cu_seqlens", sharder.cu_seqlens(m));
      out.add(key + "cu_seqlens_padded", sharder.cu_seqlens_padded(m));
    }
  }
  return out.serialise();
}

// Payload: layout then case.
const RankTask shard_bshd("shard_bshd", [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [layout, c] = decode_with<BshdCase>(p);
  const auto memory = static_cast<MemoryLayout>(layout);
  const Sharder s = prepare_cp_inputs(lay_out_batch(to_cp_batch(make_batch(c)), strided(memory)),
                                      mesh, c.num_chunks, c.shard_primary, pad_of(options_of(c)));
  return shard_task(c, s, memory, mesh);
});

const RankTask shard_packed("shard_packed", [](const std::string& p, const MeshPtr& mesh, int) {
  const auto [layout, c] = decode_with<PackedCase>(p);
  const auto memory = static_cast<MemoryLayout>(layout);
  const Sharder s = prepare_packed_cp_inputs(
      lay_out_batch(to_cp_batch(make_batch(c)), strided(memory)), mesh,
      static_cast<int>(c.rows.size()), c.shard_primary, pad_of(options_of(c)));
  return shard_task(c, s, memory, mesh);
});

// ---- the check side ----

template <class Case>
void check_rank(const Case& c, const Bundle& b, const reference::Sharder& ref,
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
    if (e.inputs_embeds) {
      const auto& local = *e.inputs_embeds;
      const auto grads = cut_upstream(c.seed, m, r, static_cast<Eigen::Index>(local.size()),
                                      local[0].rows(), local[0].cols());
      require_same(b.get(key + "cut_grad"), to_tensor(ref.cut_spliced_backward(m, r, grads)),
                   "in-forward cut backward" + where);
    }
  }
  if (g.cu_seqlens.size() > 0) {
    require_same(b.get(key + "cu_seqlens"), to_tensor(g.cu_seqlens), "cu_seqlens" + where);
    require_same(b.get(key + "cu_seqlens_padded"), to_tensor(g.cu_seqlens_padded),
                 "cu_seqlens_padded" + where);
  }
}

template <class Case, class Prepare>
void check_case(const Case& c, const RankTask& task, Prepare prepare) {
  const reference::Sharder ref = prepare(c);
  Case eager_case = c;
  eager_case.shard_primary = true;
  const reference::Sharder eager = prepare(eager_case);
  const MemoryLayout layout = *gen_memory_layout();
  RC_TAG(layout_name(layout));
  const auto bundles = task.run(c.cp, encode_with(static_cast<int>(layout), c));
  for (int m = 0; m < ref.num_microbatches(); ++m)
    for (int r = 0; r < c.cp; ++r) check_rank(c, bundles[r], ref, eager, m, r);
}

void check_bshd(const BshdCase& c) {
  check_case(c, shard_bshd, [](const BshdCase& k) {
    return reference::prepare_cp_inputs(make_batch(k), options_of(k));
  });
}

void check_packed(const PackedCase& c) {
  check_case(c, shard_packed, [](const PackedCase& k) {
    return reference::prepare_packed_cp_inputs(make_batch(k), options_of(k));
  });
}

RC_GTEST_PROP(OptimizedSharding, BshdEqualsReferenceRankByRank, ()) {
  check_bshd(*gen_bshd_case());
}

RC_GTEST_PROP(OptimizedSharding, ThdEqualsReferenceRankByRank, ()) {
  check_packed(*gen_packed_case());
}

// Layouts (SPEC 2b): every kind's shards equal the reference's rank by rank, and restore_order
// puts them back in global order.
RC_GTEST_PROP(OptimizedSharding, EveryLayoutEqualsReferenceRankByRank, ()) {
  BshdCase b = *gen_bshd_case();
  b.layout = *gen_bshd_layout();
  check_bshd(b);
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.cp = *rc::gen::inRange(2, 9);
  p.rows[0].push_back({*rc::gen::inRange(0, 400), *rc::gen::inRange(0, 3)});  // long enough to cut
  check_packed(p);
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

// CP = 1 is the identity on layout (docs/spec.md section 1): with any pad_multiple, the
// shards equal the reference's, which pads nothing, and are as long as the input.
RC_GTEST_PROP(OptimizedSharding, Cp1IsIdentityOnLayout, ()) {
  BshdCase b = *gen_bshd_case();
  b.cp = 1;
  b.pad_multiple = *rc::gen::inRange(2, 5);
  check_bshd(b);
  const Sharder s = prepare_cp_inputs_for(to_cp_batch(make_batch(b)), 1, b.num_chunks, true,
                                          pad_of(options_of(b)));
  RC_ASSERT(s.local(0).labels.size(1) == b.seq_len);
  PackedCase p = *gen_packed_case();
  p.cp = 1;
  p.pad_multiple = b.pad_multiple;
  check_packed(p);
}

// The balanced planner (spec 2b) against the reference's, plan for plan, in-process: rows of
// short, long and very long documents (some longer than a rank), a row tail or none, CP 2-8,
// any balance_slack from "most even" to "fewest cuts".
RC_GTEST_PROP(OptimizedSharding, BalancedPlanEqualsReference, ()) {
  const int cp = *rc::gen::inRange(2, 9);
  const auto slots = *rc::gen::container<std::vector<std::int64_t>>(
      rc::gen::oneOf(rc::gen::inRange<std::int64_t>(0, 40), rc::gen::inRange<std::int64_t>(40, 700),
                     rc::gen::inRange<std::int64_t>(700, 4000)));
  std::int64_t T = 0;
  for (const std::int64_t n : slots) T += n;
  T += *rc::gen::inRange<std::int64_t>(T == 0 ? 1 : 0, 64);
  const double slack = *rc::gen::element(0.0, 0.005, 0.02, 0.1, 10.0);
  RC_TAG(slack);
  const LayoutPlan plan = plan_balanced(slots, T, cp, 1, slack);
  const reference::LayoutPositions want =
      reference::plan_balanced_positions(slots, plan.padded_len, cp, slack);
  for (int r = 0; r < cp; ++r)
    RC_ASSERT(layout_positions(plan, r) == want[static_cast<std::size_t>(r)]);
}

}  // namespace
}  // namespace cpkit::harness
