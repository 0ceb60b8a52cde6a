// pack_documents (docs/spec.md section 2c): a data loader's helper that assigns one step's
// documents to its packed rows (every DP rank's microbatches) so that the rows' attention
// work is even; the balanced layout then evens each row over its CP ranks. Deterministic
// from its arguments: every rank computes the same rows with no communication.
#pragma once

#include <cstdint>
#include <vector>

namespace cpkit {

// The keys a document's queries attend under causal attention with a sliding window of
// `window` keys (0: none): sum over positions p of min(p + 1, window).
std::int64_t document_work(std::int64_t length, std::int64_t window = 0);

// Each document's row in [0, rows): longest work first, each to the row with the least work
// among those with room for it (capacity tokens a row). Within a row, documents keep their
// input order. Raises naming `lengths` (a length < 1), `rows`, `capacity` (< 1, or a
// document that fits no row) or `window` (< 0).
std::vector<std::int64_t> pack_documents(const std::vector<std::int64_t>& lengths,
                                         std::int64_t rows, std::int64_t capacity,
                                         std::int64_t window = 0);

}  // namespace cpkit
