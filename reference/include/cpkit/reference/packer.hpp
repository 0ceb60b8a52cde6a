// Documents into packed rows with even attention work (docs/spec.md section 2c), written
// from the spec's words: the oracle the optimized packer is compared with.
#pragma once

#include <cstdint>
#include <vector>

namespace cpkit::reference {

// The keys a document's queries attend: sum over its positions of min(position + 1, window),
// window 0 meaning none.
std::int64_t document_work(std::int64_t length, std::int64_t window);

// Each document's row. Raises naming `lengths`, `rows`, `capacity` or `window`.
std::vector<std::int64_t> pack_documents(const std::vector<std::int64_t>& lengths,
                                         std::int64_t rows, std::int64_t capacity,
                                         std::int64_t window);

}  // namespace cpkit::reference
