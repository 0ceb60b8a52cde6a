// The value-check switch (cpkit/optimized/validation.hpp).
#include "cpkit/optimized/validation.hpp"

#include <atomic>

#include "tensor_checks.hpp"

namespace cpkit {

namespace {
std::atomic<ValueChecks> current{ValueChecks::kCpuOnly};
}  // namespace

void set_value_checks(ValueChecks checks) { current.store(checks); }
ValueChecks value_checks() { return current.load(); }

namespace detail {

bool check_values_of(const at::Tensor& t) {
  switch (value_checks()) {
    case ValueChecks::kAlways:
      return true;
    case ValueChecks::kNever:
      return false;
    case ValueChecks::kCpuOnly:
      break;
  }
  return !t.is_cuda();
}

}  // namespace detail
}  // namespace cpkit
