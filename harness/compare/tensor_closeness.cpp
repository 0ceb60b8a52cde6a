#include "tensor_closeness.hpp"

#include <ATen/ATen.h>

#include <sstream>

#include "closeness.hpp"

namespace cpkit::harness {

std::string tensor_mismatch(const at::Tensor& actual, const at::Tensor& expected, double atol,
                            double rtol) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "shape " << actual.sizes() << ", expected " << expected.sizes();
    return os.str();
  }
  const at::Tensor a = actual.detach().cpu().to(at::kDouble).contiguous();
  const at::Tensor e = expected.detach().cpu().to(at::kDouble).contiguous();
  const auto i = first_mismatch(a.data_ptr<double>(), e.data_ptr<double>(),
                                static_cast<std::size_t>(a.numel()), atol, rtol);
  if (!i) return {};
  return describe_mismatch(*i, a.data_ptr<double>()[*i], e.data_ptr<double>()[*i], atol, rtol);
}

}  // namespace cpkit::harness
