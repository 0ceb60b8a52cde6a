// gtest glue for rank processes.
#pragma once

#include <gtest/gtest.h>

#include <string>

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

// A test whose body runs once per CP size, in one process: one process start per test rather
// than per size (a sanitized process costs ~1 s to start and leak-check). The body reads the
// size as `cp_size_param`; a failure names its size.
#define CPKIT_TEST_AT_CP_SIZES(suite, name, ...) \
  void suite##_##name(int cp_size_param);        \
  TEST(suite, name) {                            \
    for (const int cp : {__VA_ARGS__}) {         \
      SCOPED_TRACE("CP " + std::to_string(cp));  \
      suite##_##name(cp);                        \
    }                                            \
  }                                              \
  void suite##_##name(int cp_size_param)
