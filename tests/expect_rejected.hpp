// Shared by both bad-input catalogues: the call must throw `ErrorType` naming `argument`,
// and its message must hold every fragment (the offending values).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

namespace cpkit::test {

template <class ErrorType>
void expect_rejected(const std::function<void()>& call, const std::string& argument,
                     std::initializer_list<std::string> fragments) {
  try {
    call();
    ADD_FAILURE() << "no error raised; expected one naming '" << argument << "'";
  } catch (const ErrorType& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message lacks '" << f << "': " << e.what();
  }
}

}  // namespace cpkit::test
