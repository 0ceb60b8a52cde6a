// Rows kept in a set ordered by (work, tokens, row): the least-loaded row with room is the
// first from the front with enough room, usually the front itself.
#include "cpkit/optimized/packer.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include "cpkit/optimized/error.hpp"

namespace cpkit {

std::int64_t document_work(std::int64_t length, std::int64_t window) {
  if (window <= 0 || length <= window) return length * (length + 1) / 2;
  return window * (window + 1) / 2 + (length - window) * window;
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
  std::transform(lengths.begin(), lengths.end(), work.begin(),
                 [&](std::int64_t n) { return document_work(n, window); });
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return work[a] > work[b]; });
  using Row = std::tuple<std::int64_t, std::int64_t, std::int64_t>;  // work, tokens, row
  std::set<Row> by_load;
  for (std::int64_t r = 0; r < rows; ++r) by_load.insert({0, 0, r});
  std::vector<std::int64_t> row_of(lengths.size());
  for (const std::size_t i : order) {
    const auto fits = std::find_if(by_load.begin(), by_load.end(), [&](const Row& row) {
      return capacity - std::get<1>(row) >= lengths[i];
    });
    if (fits == by_load.end()) {
      std::int64_t fewest = capacity;
      for (const Row& row : by_load) fewest = std::min(fewest, std::get<1>(row));
      raise("capacity", "document ", i, " of ", lengths[i],
            " tokens fits no row (the most room left is ", capacity - fewest, "; ",
            std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}), " tokens in all for ",
            rows, " rows of ", capacity, ")");
    }
    const auto [w, tokens, r] = *fits;
    by_load.erase(fits);
    by_load.insert({w + work[i], tokens + lengths[i], r});
    row_of[i] = r;
  }
  return row_of;
}

}  // namespace cpkit
