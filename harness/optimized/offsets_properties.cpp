// Varlen attention offsets (docs/spec.md section 4a) on the optimized path in real rank
// processes: every rank's offsets equal the reference's exactly (which the reference's own
// properties prove equal to the masked CP attention), and batches no offsets can express
// raise on every rank naming the same argument.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "case_codec.hpp"
#include "compare.hpp"
#include "convert.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "rank_task.hpp"

namespace cpkit::harness {
namespace {

std::string offsets_of(const Sharder& sharder) {
  pool::Bundle out;
  for (int m = 0; m < sharder.num_microbatches(); ++m) {
    const std::string key = std::to_string(m) + ".";
    const AttentionOffsets o = sharder.attention_offsets(m);
    out.add(key + "cu_seqlens_q", o.cu_seqlens_q);
    out.add(key + "cu_seqlens_k", o.cu_seqlens_k);
    out.add(key + "scalars", at::tensor({o.max_seqlen_q, o.max_seqlen_k, o.k_begin, o.k_end}));
    out.add(key + "k_index", o.k_index.defined() ? o.k_index : at::empty({0}, at::kLong));
  }
  return out.serialise();
}

const RankTask offsets_bshd("offsets_bshd", [](const std::string& p, const MeshPtr& mesh, int) {
  const BshdCase c = decode_bshd(p);
  return offsets_of(prepare_cp_inputs(to_cp_batch(make_batch(c)), mesh, c.num_chunks, true,
                                      pad_of(options_of(c))));
});

const RankTask offsets_packed("offsets_packed", [](const std::string& p, const MeshPtr& mesh, int) {
  const PackedCase c = decode_packed(p);
  return offsets_of(prepare_packed_cp_inputs(to_cp_batch(make_batch(c)), mesh,
                                             static_cast<int>(c.rows.size()), true,
                                             pad_of(options_of(c))));
});

template <class Case>
void check_offsets(const Case& c, const reference::Sharder& ref, const RankTask& task) {
  std::string ref_error;
  std::vector<std::vector<reference::AttentionOffsets>> expected;
  try {
    for (int m = 0; m < ref.num_microbatches(); ++m) {
      expected.emplace_back();
      for (int r = 0; r < c.cp; ++r) expected.back().push_back(attention_offsets(ref, m, r));
    }
  } catch (const reference::Error& e) {
    ref_error = e.argument();
  }
  if (!ref_error.empty()) {
    RC_TAG("rejected");
    const auto replies = task.replies(c.cp, encode(c));
    for (int r = 0; r < c.cp; ++r) {
      RC_ASSERT(!replies[r].ok);
      RC_ASSERT(replies[r].bytes.find("argument '" + ref_error + "'") != std::string::npos);
    }
    return;
  }
  const auto bundles = task.run(c.cp, encode(c));
  for (int m = 0; m < ref.num_microbatches(); ++m)
    for (int r = 0; r < c.cp; ++r) {
      const reference::AttentionOffsets& e = expected[m][r];
      const pool::Bundle& b = bundles[r];
      const std::string key = std::to_string(m) + ".";
      const std::string where =
          " (microbatch " + std::to_string(m) + ", rank " + std::to_string(r) + ")";
      RC_ASSERT(b.get(key + "cu_seqlens_q").scalar_type() == at::kInt);
      require_same(b.get(key + "cu_seqlens_q").to(at::kLong), to_tensor(e.cu_seqlens_q),
                   "cu_seqlens_q" + where);
      require_same(b.get(key + "cu_seqlens_k").to(at::kLong), to_tensor(e.cu_seqlens_k),
                   "cu_seqlens_k" + where);
      require_same(b.get(key + "scalars"),
                   at::tensor({e.max_seqlen_q, e.max_seqlen_k, e.k_begin, e.k_end}),
                   "max_seqlen_q, max_seqlen_k, k_begin, k_end" + where);
      require_same(b.get(key + "k_index"), to_tensor(e.k_index), "k_index" + where);
    }
}

RC_GTEST_PROP(OptimizedOffsets, PackedEqualsReference, ()) {
  const PackedCase c = *gen_packed_case();
  check_offsets(c, reference::prepare_packed_cp_inputs(make_batch(c), options_of(c)),
                offsets_packed);
}

RC_GTEST_PROP(OptimizedOffsets, BshdEqualsReference, ()) {
  const BshdCase c = *gen_attention_bshd_case();
  check_offsets(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), offsets_bshd);
}

// Layouts (SPEC 2b, 4a): segments per run of one document, keys picked by k_index.
RC_GTEST_PROP(OptimizedOffsets, EveryLayoutEqualsReference, ()) {
  PackedCase p = *gen_packed_case();
  p.layout = *gen_packed_layout();
  p.rows[0].push_back({*rc::gen::inRange(0, 300), *rc::gen::inRange(0, 3)});  // long enough to cut
  check_offsets(p, reference::prepare_packed_cp_inputs(make_batch(p), options_of(p)),
                offsets_packed);
  BshdCase b = *gen_attention_bshd_case();
  b.layout = *gen_bshd_layout();
  check_offsets(b, reference::prepare_cp_inputs(make_batch(b), options_of(b)), offsets_bshd);
}

// Random masks (holes) and restarting positions: rejected exactly when the reference rejects.
RC_GTEST_PROP(OptimizedOffsets, InexpressibleBatchesRejectedLikeTheReference, ()) {
  const BshdCase c = *gen_bshd_case();
  check_offsets(c, reference::prepare_cp_inputs(make_batch(c), options_of(c)), offsets_bshd);
}

}  // namespace
}  // namespace cpkit::harness
