// docs/spec.md section 2c on both implementations: for random documents (a few long ones
// among many short, as in lognormal data), rows, capacities from tight to loose and windows,
// the optimized packer assigns every document to the reference's row, or both raise naming
// the same argument; every row within its capacity. With room to spare its rows' work is as
// even as the greedy rule promises (LPT: the heaviest row is at most the mean plus the
// largest document).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/packer.hpp"
#include "cpkit/reference/error.hpp"
#include "cpkit/reference/packer.hpp"

namespace cpkit::harness {
namespace {

RC_GTEST_PROP(OptimizedPacker, EqualsReferenceAndKeepsCapacity, ()) {
  const auto length = rc::gen::weightedOneOf<std::int64_t>(
      {{6, rc::gen::inRange<std::int64_t>(1, 40)}, {1, rc::gen::inRange<std::int64_t>(40, 600)}});
  const auto lengths = *rc::gen::container<std::vector<std::int64_t>>(length);
  const std::int64_t rows = *rc::gen::inRange<std::int64_t>(1, 9);
  const std::int64_t total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  const std::int64_t longest =
      lengths.empty() ? 1 : *std::max_element(lengths.begin(), lengths.end());
  // From too tight (some document may fit no row) to loose.
  const std::int64_t capacity =
      std::max<std::int64_t>(1, (total / rows) * *rc::gen::inRange(90, 160) / 100 +
                                    *rc::gen::inRange<std::int64_t>(0, 2) * longest);
  const std::int64_t window = *rc::gen::element<std::int64_t>(0, 0, 1, 16, 128);
  std::string ref_error, opt_error;
  std::vector<std::int64_t> ref_rows, opt_rows;
  try {
    ref_rows = reference::pack_documents(lengths, rows, capacity, window);
  } catch (const reference::Error& e) {
    ref_error = e.argument();
  }
  try {
    opt_rows = pack_documents(lengths, rows, capacity, window);
  } catch (const Error& e) {
    opt_error = e.argument();
  }
  RC_ASSERT(opt_error == ref_error);
  RC_ASSERT(opt_rows == ref_rows);
  if (!ref_error.empty()) return;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(rows), 0);
  std::vector<std::int64_t> work(static_cast<std::size_t>(rows), 0);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    RC_ASSERT(opt_rows[i] >= 0 && opt_rows[i] < rows);
    tokens[static_cast<std::size_t>(opt_rows[i])] += lengths[i];
    work[static_cast<std::size_t>(opt_rows[i])] += reference::document_work(lengths[i], window);
    RC_ASSERT(document_work(lengths[i], window) == reference::document_work(lengths[i], window));
  }
  for (const std::int64_t t : tokens) RC_ASSERT(t <= capacity);
}

RC_GTEST_PROP(OptimizedPacker, EvensWorkWhenRoomIsAmple, ()) {
  // With room for everything in every row the greedy rule is LPT: the heaviest row exceeds
  // the mean by at most the largest document's work.
  const auto lengths = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 300)));
  const std::int64_t rows = *rc::gen::inRange<std::int64_t>(1, 9);
  const std::int64_t total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  const std::vector<std::int64_t> row_of = pack_documents(lengths, rows, total, 0);
  std::vector<std::int64_t> work(static_cast<std::size_t>(rows), 0);
  std::int64_t largest = 0, all = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t w = lengths[i] * (lengths[i] + 1) / 2;
    work[static_cast<std::size_t>(row_of[i])] += w;
    largest = std::max(largest, w);
    all += w;
  }
  const std::int64_t heaviest = *std::max_element(work.begin(), work.end());
  RC_ASSERT(heaviest * rows <= all + largest * rows);
}

}  // namespace
}  // namespace cpkit::harness
