// Padding before the cut (docs/spec.md section 2): the padded length (internal header; the
// padded cut itself, cut_columns, is public in sharder.hpp).
#pragma once

#include <cstdint>

namespace cpkit::detail {

// S_pad: S itself at CP = 1 (the identity on layout), else the next multiple of
// CP * pad_multiple at or above S.
std::int64_t padded_length(std::int64_t seq_len, int cp_size, int pad_multiple);

}  // namespace cpkit::detail
