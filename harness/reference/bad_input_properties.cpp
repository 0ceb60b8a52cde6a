// docs/spec.md sections 3 and 6 for the reference: arbitrary packed metadata is either accepted
// with the documented invariants or rejected with cpkit::reference::Error, never a crash.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "generators.hpp"

namespace cpkit::harness {
namespace {

using namespace reference;  // the reference's types and operations, unqualified

// The SPEC 3 rules, stated directly on one row.
bool row_is_valid(const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& slots,
                  std::int64_t T) {
  bool ended = false;
  int docs = 0;
  std::int64_t total = 0;
  for (std::size_t d = 0; d < lens.size(); ++d) {
    const bool sentinel = lens[d] == kSeqLenSentinel;
    if (sentinel != (slots[d] == kSeqLenSentinel)) return false;
    if (sentinel) {
      ended = true;
      continue;
    }
    if (ended || lens[d] < 0 || slots[d] < lens[d]) return false;
    ++docs;
    total += slots[d];
  }
  return docs > 0 && total <= T;
}

RC_GTEST_PROP(ReferenceBadInput, ArbitrarySeqLensAreAcceptedOrRejectedCleanly, ()) {
  const int T = *rc::gen::inRange(1, 20);
  const int D = *rc::gen::inRange(1, 5);
  const auto entry = rc::gen::oneOf(rc::gen::just(std::int64_t{kSeqLenSentinel}),
                                    rc::gen::inRange<std::int64_t>(-2, 12));
  std::vector<std::int64_t> lens, slots;
  for (int d = 0; d < D; ++d) {
    lens.push_back(*entry);
    slots.push_back(*entry);
  }
  PackedBatch batch;
  batch.input_ids = IntMatrix::Ones(1, T);
  batch.labels = IntMatrix::Ones(1, T);
  batch.seq_lens = Eigen::Map<const IntMatrix>(lens.data(), 1, D);
  batch.seq_lens_padded = Eigen::Map<const IntMatrix>(slots.data(), 1, D);
  const bool expected_valid = row_is_valid(lens, slots, T);
  try {
    const Sharder s = prepare_packed_cp_inputs(batch, {.cp_size = *rc::gen::inRange(1, 5)});
    RC_ASSERT(expected_valid);
    RC_ASSERT(s.global(0).cu_seqlens_padded.maxCoeff() <= T);
  } catch (const Error& e) {
    RC_ASSERT(!expected_valid);
    RC_ASSERT(e.argument() == "seq_lens" || e.argument() == "seq_lens_padded");
  }
}

}  // namespace
}  // namespace cpkit::harness
