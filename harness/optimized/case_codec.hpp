// Cases travel to the rank processes as text; both sides rebuild the same tensors from them.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "generators.hpp"

namespace cpkit::harness {

std::string encode(const BshdCase& c);
std::string encode(const PackedCase& c);
BshdCase decode_bshd(const std::string& text);
PackedCase decode_packed(const std::string& text);

template <class Case>
Case decode(const std::string& text) {
  if constexpr (std::is_same_v<Case, BshdCase>)
    return decode_bshd(text);
  else
    return decode_packed(text);
}

// A task's own parameter (a number) in front of a case: "value case...".
template <class Value, class Case>
std::string encode_with(const Value& value, const Case& c) {
  std::ostringstream os;
  os.precision(17);
  os << value << " " << encode(c);
  return os.str();
}

template <class Case, class Value = int>
std::pair<Value, Case> decode_with(const std::string& text) {
  const auto space = text.find(' ');
  std::istringstream head(text.substr(0, space));
  Value value{};
  head >> value;
  return {value, decode<Case>(space == std::string::npos ? "" : text.substr(space + 1))};
}

}  // namespace cpkit::harness
