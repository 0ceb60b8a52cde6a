// gtest glue for rank processes.
#pragma once

#include <gtest/gtest.h>

#include "rank_processes.hpp"
#include "test_each.hpp"

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

// A test whose body runs once per CP size (test_each.hpp), reading it as `cp_size_param`.
#define CPKIT_TEST_AT_CP_SIZES(suite, name, ...) \
  CPKIT_TEST_FOR_EACH(suite, name, int, cp_size_param, "CP ", {__VA_ARGS__})
