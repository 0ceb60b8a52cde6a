// Layouts (SPEC 2b): which global padded positions each rank owns, as the plain list of
// positions of its local tokens, in local order.
#pragma once

#include <string>
#include <vector>

#include "cpkit/reference/types.hpp"

namespace cpkit::reference {

// positions[r][j]: the global position of rank r's local token j.
using LayoutPositions = std::vector<std::vector<std::int64_t>>;

// "contiguous", "head_tail" or "balanced"; anything else raises, naming `layout`.
void check_layout_name(const std::string& layout);

// S_pad under `layout`: S at CP = 1, else the next multiple of CP * pad_multiple
// (2 * CP * pad_multiple for head_tail).
std::int64_t layout_padded_length(const std::string& layout, std::int64_t seq_len, int cp_size,
                                  int pad_multiple);

// contiguous and head_tail: from the padded length alone.
LayoutPositions plan_positions(const std::string& layout, std::int64_t padded_len, int cp_size);
// balanced: from one packed row's slot lengths (without sentinels); the plan with the fewest
// cut documents whose work and tile cost max / mean are within 1 + balance_slack.
LayoutPositions plan_balanced_positions(const std::vector<std::int64_t>& slot_lens,
                                        std::int64_t padded_len, int cp_size, double balance_slack);

}  // namespace cpkit::reference
