#include "compare.hpp"

#include <sstream>

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
  if (optimized.sizes() != reference.sizes()) {
    std::ostringstream os;
    os << what << ": optimized " << optimized.sizes() << " vs reference " << reference.sizes();
    RC_FAIL(os.str());
  }
  const at::Tensor a = optimized.to(at::kDouble), b = reference.to(at::kDouble);
  const at::Tensor bad = ~((a - b).abs() <= atol + rtol * b.abs());  // NaN counts as bad
  if (bad.any().item<bool>()) {
    const auto i = bad.flatten().nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os.precision(9);
    os << what << ": element " << i << " is " << a.flatten()[i].item<double>() << " (optimized) vs "
       << b.flatten()[i].item<double>() << " (reference), atol " << atol << " rtol " << rtol;
    RC_FAIL(os.str());
  }
}

std::vector<pool::Bundle> bundles_of(const std::vector<pool::Reply>& replies,
                                     const std::string& task) {
  std::vector<pool::Bundle> out;
  for (std::size_t r = 0; r < replies.size(); ++r) {
    if (!replies[r].ok)
      RC_FAIL(task + ": rank " + std::to_string(r) + " raised: " + replies[r].bytes);
    out.push_back(pool::Bundle::parse(replies[r].bytes));
  }
  return out;
}

}  // namespace cpkit::harness
