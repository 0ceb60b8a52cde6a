// The one exception type of the reference. Messages name the argument and the offending
// values so that a bad batch in a long training job is diagnosable from the log alone.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace cpkit::reference {

class Error : public std::invalid_argument {
 public:
  Error(std::string argument, const std::string& detail)
      : std::invalid_argument("cpkit::reference: argument '" + argument + "': " + detail),
        argument_(std::move(argument)) {}
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

// Builds the detail text from streamable pieces: raise("seq_lens", "row ", b, " sums to ", n).
template <class... Parts>
[[noreturn]] void raise(const std::string& argument, const Parts&... parts) {
  std::ostringstream detail;
  (detail << ... << parts);
  throw Error(argument, detail.str());
}

}  // namespace cpkit::reference
