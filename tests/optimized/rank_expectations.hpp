// gtest glue for rank processes.
#pragma once

#include <gtest/gtest.h>

#include "rank_processes.hpp"

namespace cpkit::testing {

using ranks::require;
using ranks::require_close;
using ranks::require_equal;
using ranks::run_ranks;

// One failure per rank that did not succeed.
inline void expect_all_ranks_ok(const std::vector<ranks::RankOutcome>& outcomes) {
  for (const auto& o : outcomes)
    EXPECT_TRUE(o.ok) << "rank " << o.rank << " of " << outcomes.size() << ": " << o.message;
}

}  // namespace cpkit::testing
