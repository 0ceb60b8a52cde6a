// docs/spec.md sections 3 and 6 on both implementations: arbitrary packed metadata is accepted by
// both or rejected by both, naming the same argument; never a crash or a hang.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "convert.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit::harness {
namespace {

RC_GTEST_PROP(OptimizedBadInput, SeqLensRejectedLikeTheReference, ()) {
  const int T = *rc::gen::inRange(1, 20);
  const int D = *rc::gen::inRange(1, 5);
  const auto entry =
      rc::gen::oneOf(rc::gen::just(std::int64_t{-1000}), rc::gen::inRange<std::int64_t>(-2, 12));
  reference::PackedBatch ref;
  ref.input_ids = reference::IntMatrix::Ones(1, T);
  ref.labels = reference::IntMatrix::Ones(1, T);
  ref.seq_lens.resize(1, D);
  ref.seq_lens_padded.resize(1, D);
  for (int d = 0; d < D; ++d) {
    ref.seq_lens(0, d) = *entry;
    ref.seq_lens_padded(0, d) = *entry;
  }
  const int cp = *rc::gen::inRange(1, 5);
  std::string ref_error, opt_error;
  try {
    reference::prepare_packed_cp_inputs(ref, {.cp_size = cp});
  } catch (const reference::Error& e) {
    ref_error = e.argument();
  }
  try {
    prepare_packed_cp_inputs_for(to_cp_batch(ref), cp, 1);
  } catch (const Error& e) {
    opt_error = e.argument();
  }
  RC_ASSERT(ref_error == opt_error);
}

}  // namespace
}  // namespace cpkit::harness
