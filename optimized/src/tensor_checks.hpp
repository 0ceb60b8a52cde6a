// Argument checks and dtype mapping shared by the optimized operations (internal header).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <sstream>
#include <string>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/error.hpp"

namespace cpkit::detail {

inline std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

inline ScalarKind scalar_kind(const at::Tensor& t, const char* argument) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ScalarKind::kFloat32;
    case at::kHalf:
      return ScalarKind::kFloat16;
    case at::kBFloat16:
      return ScalarKind::kBFloat16;
    case at::kLong:
      return ScalarKind::kInt64;
    case at::kDouble:
      return ScalarKind::kFloat64;
    case at::kBool:
    case at::kByte:
      return ScalarKind::kUInt8;
    default:
      raise(argument, "dtype ", t.scalar_type(),
            " is not supported (float32, float64, float16, bfloat16, int64, bool, uint8)");
  }
}

// Whether the value checks run on `t` (cpkit/optimized/validation.hpp's switch).
bool check_values_of(const at::Tensor& t);

inline void require_defined(const at::Tensor& t, const char* argument) {
  if (!t.defined()) raise(argument, "is an undefined tensor");
}

inline void require_dtype(const at::Tensor& t, at::ScalarType dtype, const char* argument) {
  if (t.scalar_type() != dtype) raise(argument, "must be ", dtype, ", got ", t.scalar_type());
}

// Kernels read raw rows: a strided tensor is an error, never silently copied.
inline void require_contiguous(const at::Tensor& t, const char* argument) {
  if (!t.is_contiguous())
    raise(argument, "must be contiguous (shape ", shape_of(t), ", strides ", t.strides(),
          "); a silent copy is never made");
}

inline void require_dim(const at::Tensor& t, int64_t dim, const char* argument) {
  if (t.dim() != dim)
    raise(argument, "must have ", dim, " dimensions, got ", t.dim(), " (shape ", shape_of(t), ")");
}

// The soft cap c of c * tanh(z / c): 0 (off) or a finite positive number. A negative or
// non-finite cap means nothing, so it is an error rather than silently "off".
inline void check_softcap(double softcap) {
  if (!(softcap >= 0.0) || !std::isfinite(softcap))
    raise("softcap", "must be finite and >= 0 (0: off), got ", softcap);
}

}  // namespace cpkit::detail
