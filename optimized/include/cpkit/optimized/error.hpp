// The exception type of the optimized path. Messages name the argument and the offending
// values, and every rank raises the same one, so a bad batch never hangs a collective.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace cpkit {

class Error : public std::invalid_argument {
 public:
  Error(std::string argument, const std::string& detail)
      : std::invalid_argument("cpkit: argument '" + argument + "': " + detail),
        argument_(std::move(argument)) {}
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

template <class... Parts>
[[noreturn]] void raise(const std::string& argument, const Parts&... parts) {
  std::ostringstream detail;
  (detail << ... << parts);
  throw Error(argument, detail.str());
}

}  // namespace cpkit
