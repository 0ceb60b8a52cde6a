#include "compare.hpp"

#include <rapidcheck.h>

#include <sstream>

#include "tensor_closeness.hpp"

namespace cpkit::harness {

void require_same(const at::Tensor& optimized, const at::Tensor& reference,
                  const std::string& what) {
  if (optimized.sizes() != reference.sizes() ||
      optimized.scalar_type() != reference.scalar_type()) {
    std::ostringstream os;
    os << what << ": optimized " << optimized.sizes() << " " << optimized.scalar_type()
       << " vs reference " << reference.sizes() << " " << reference.scalar_type();
    RC_FAIL(os.str());
  }
  if (!at::equal(optimized, reference)) {
    const auto i = (optimized != reference).flatten().nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os << what << ": element " << i << " is " << optimized.flatten()[i].item<double>()
       << " (optimized) vs " << reference.flatten()[i].item<double>() << " (reference)";
    RC_FAIL(os.str());
  }
}

void require_near(const at::Tensor& optimized, const at::Tensor& reference, double atol,
                  double rtol, const std::string& what) {
  const std::string diff = tensor_mismatch(optimized, reference, atol, rtol);
  if (!diff.empty()) RC_FAIL(what + " (optimized vs reference): " + diff);
}

}  // namespace cpkit::harness
