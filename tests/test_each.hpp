// One gtest test whose body runs once per value, in one process: one process start per test
// rather than per value (a sanitized process costs ~1 s to start and leak-check). The body
// reads the value as `param` (a const `type`&); a failure names it (`label` then the value);
// an empty list is a failure.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#define CPKIT_TEST_FOR_EACH(suite, name, type, param, label, ...)         \
  void suite##_##name(const type& param);                                 \
  TEST(suite, name) {                                                     \
    const std::vector<type> values = __VA_ARGS__;                         \
    EXPECT_FALSE(values.empty()) << "nothing to run";                     \
    for (const type& value : values) {                                    \
      SCOPED_TRACE(std::string(label) + ::testing::PrintToString(value)); \
      suite##_##name(value);                                              \
    }                                                                     \
  }                                                                       \
  void suite##_##name(const type& param)
