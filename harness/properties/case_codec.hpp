// Cases travel to the rank processes as text; both sides rebuild the same tensors from them.
#pragma once

#include <string>

#include "generators.hpp"

namespace cpkit::harness {

using reference::harness::BshdCase;
using reference::harness::PackedCase;

std::string encode(const BshdCase& c);
std::string encode(const PackedCase& c);
BshdCase decode_bshd(const std::string& text);
PackedCase decode_packed(const std::string& text);

}  // namespace cpkit::harness
