// Built without LibTorch: --impl optimized explains why it is unavailable.
#include <stdexcept>

#include "demo.hpp"

namespace cpkit::demo {

DemoResult run_optimized(const DemoOptions&) {
  throw std::invalid_argument(
      "--impl optimized: this cpkit-demo was built without LibTorch (-DCPKIT_WITH_TORCH=OFF)");
}

bool run_launched(const DemoOptions&, std::ostream&) {
  throw std::invalid_argument(
      "--launcher env: this cpkit-demo was built without LibTorch (-DCPKIT_WITH_TORCH=OFF)");
}

}  // namespace cpkit::demo
