// Section 2c step by step: the placement order sorted once, then for each document every
// row's (work, tokens, row) key compared among the rows with room.
#include "cpkit/reference/packer.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "cpkit/reference/error.hpp"

namespace cpkit::reference {

std::int64_t document_work(std::int64_t length, std::int64_t window) {
  std::int64_t work = 0;
  for (std::int64_t p = 0; p < length; ++p) work += window > 0 ? std::min(p + 1, window) : p + 1;
  return work;
}

std::vector<std::int64_t> pack_documents(const std::vector<std::int64_t>& lengths,
                                         std::int64_t rows, std::int64_t capacity,
                                         std::int64_t window) {
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1)
      raise("lengths", "document ", i, " has length ", lengths[i], " (must be >= 1)");
  if (rows < 1) raise("rows", "must be >= 1, got ", rows);
  if (capacity < 1) raise("capacity", "must be >= 1, got ", capacity);
  if (window < 0) raise("window", "must be >= 0 (0: none), got ", window);
  std::vector<std::int64_t> work(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) work[i] = document_work(lengths[i], window);
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return work[a] > work[b]; });
  std::vector<std::int64_t> row_work(static_cast<std::size_t>(rows), 0);
  std::vector<std::int64_t> row_tokens(static_cast<std::size_t>(rows), 0);
  std::vector<std::int64_t> row_of(lengths.size(), -1);
  for (const std::size_t i : order) {
    std::int64_t best = -1;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (capacity - row_tokens[ur] < lengths[i]) continue;
      const auto ub = static_cast<std::size_t>(best);
      if (best < 0 ||
          std::tie(row_work[ur], row_tokens[ur]) < std::tie(row_work[ub], row_tokens[ub]))
        best = r;
    }
    if (best < 0) {
      const std::int64_t room = capacity - *std::min_element(row_tokens.begin(), row_tokens.end());
      const std::int64_t total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
      raise("capacity", "document ", i, " of ", lengths[i],
            " tokens fits no row (the most room left is ", room, "; ", total, " tokens in all for ",
            rows, " rows of ", capacity, ")");
    }
    row_of[i] = best;
    row_work[static_cast<std::size_t>(best)] += work[i];
    row_tokens[static_cast<std::size_t>(best)] += lengths[i];
  }
  return row_of;
}

}  // namespace cpkit::reference
