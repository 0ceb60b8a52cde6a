// The optimized attention plan (which keys each rank sends and receives, docs/spec.md section
// 4b) against the reference's needed_keys, computed independently from the reference's own
// shards: equal for every rank pair, every layout, BSHD and THD rows, with and without a
// sliding window. Planning needs no communication, so all ranks are planned in one process.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "convert.hpp"
#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "generators.hpp"

namespace cpkit::harness {
namespace {

// The reference's needed keys of microbatch m, row-major local indices (b * L + j).
std::vector<std::vector<std::vector<std::int64_t>>> reference_needed(const reference::Sharder& s,
                                                                     int m, std::int64_t window) {
  const int cp = s.options().cp_size;
  std::vector<std::vector<std::vector<std::int64_t>>> out(
      static_cast<std::size_t>(cp),
      std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(cp)));
  std::vector<reference::LocalShard> shards;
  for (int r = 0; r < cp; ++r) shards.push_back(s.local(m, r));
  const auto rows = shards[0].labels.rows(), L = shards[0].labels.cols();
  for (Eigen::Index b = 0; b < rows; ++b) {
    std::vector<reference::TokenMeta> metas;
    for (const auto& l : shards)
      metas.push_back({l.position_ids.row(b).transpose(), l.document_ids.row(b).transpose(),
                       l.padding.row(b).transpose()});
    const reference::NeededKeys needed = reference::needed_keys(metas, window);
    for (int r = 0; r < cp; ++r)
      for (int o = 0; o < cp; ++o)
        for (const Eigen::Index j :
             needed[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)])
          out[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)].push_back(b * L + j);
  }
  return out;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (const auto x : v) s += std::to_string(x) + " ";
  return s + "]";
}

template <class Case>
void check_plans(const Case& c, const reference::Sharder& ref, const Sharder& opt) {
  const std::int64_t window = *rc::gen::element<std::int64_t>(0, 0, 1, 2, 5);
  for (int m = 0; m < ref.num_microbatches(); ++m) {
    const auto needed = reference_needed(ref, m, window);
    for (int r = 0; r < c.cp; ++r) {
      const AttentionPlan plan = attention_plan(opt, m, r, window);
      RC_ASSERT(plan.cp_size == c.cp);
      std::int64_t received = 0;
      for (int o = 0; o < c.cp; ++o) {
        const auto& send = plan.send[static_cast<std::size_t>(o)];
        const auto& recv = plan.recv[static_cast<std::size_t>(o)];
        const auto& want_send = needed[static_cast<std::size_t>(o)][static_cast<std::size_t>(r)];
        const auto& want_recv = needed[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)];
        const std::string where = " (microbatch " + std::to_string(m) + ", rank " +
                                  std::to_string(r) + ", peer " + std::to_string(o) + ", window " +
                                  std::to_string(window) + ")";
        if (send != want_send) RC_FAIL("send " + list(send) + " vs " + list(want_send) + where);
        if (recv != want_recv) RC_FAIL("recv " + list(recv) + " vs " + list(want_recv) + where);
        received += static_cast<std::int64_t>(recv.size());
      }
      RC_ASSERT(plan.received_keys() == received);
      RC_ASSERT(received <= plan.all_gather_keys());
    }
  }
}

RC_GTEST_PROP(OptimizedAttentionPlan, PackedEqualsReferenceNeededKeys, ()) {
  PackedCase c = *gen_packed_case();
  c.layout = *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_packed_layout());
  const reference::Sharder ref = reference::prepare_packed_cp_inputs(make_batch(c), options_of(c));
  const Sharder opt =
      prepare_packed_cp_inputs_for(to_cp_batch(make_batch(c)), c.cp,
                                   static_cast<int>(c.rows.size()), true, pad_of(options_of(c)));
  check_plans(c, ref, opt);
}

RC_GTEST_PROP(OptimizedAttentionPlan, BshdEqualsReferenceNeededKeys, ()) {
  BshdCase c = *gen_bshd_case();
  c.layout = *rc::gen::oneOf(rc::gen::just(std::string("contiguous")), gen_bshd_layout());
  const reference::Sharder ref = reference::prepare_cp_inputs(make_batch(c), options_of(c));
  const Sharder opt = prepare_cp_inputs_for(to_cp_batch(make_batch(c)), c.cp, c.num_chunks, true,
                                            pad_of(options_of(c)));
  check_plans(c, ref, opt);
}

}  // namespace
}  // namespace cpkit::harness
