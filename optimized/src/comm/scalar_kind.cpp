#include "cpkit/optimized/communicator.hpp"

namespace cpkit {

std::size_t element_size(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat32:
      return 4;
    case ScalarKind::kFloat16:
    case ScalarKind::kBFloat16:
      return 2;
    case ScalarKind::kInt64:
      return 8;
    case ScalarKind::kUInt8:
      return 1;
  }
  return 0;
}

const char* scalar_name(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat32:
      return "float32";
    case ScalarKind::kFloat16:
      return "float16";
    case ScalarKind::kBFloat16:
      return "bfloat16";
    case ScalarKind::kInt64:
      return "int64";
    case ScalarKind::kUInt8:
      return "uint8";
  }
  return "?";
}

}  // namespace cpkit
