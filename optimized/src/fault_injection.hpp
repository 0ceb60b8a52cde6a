// Test-only fault injection. A build with -DCPKIT_FAULT_INJECTION (the harness's
// cpkit_optimized_faulty library, never what trainers link) plants the bug named by the
// environment variable CPKIT_FAULT, so the harness can show that each property catches its
// class of bug (docs/harness.md). In every other build fault() is constant false.
#pragma once

#include <cstdlib>
#include <cstring>

namespace cpkit::detail {

inline bool fault(const char* name) {
#ifdef CPKIT_FAULT_INJECTION
  const char* active = std::getenv("CPKIT_FAULT");
  return active != nullptr && std::strcmp(active, name) == 0;
#else
  (void)name;
  return false;
#endif
}

}  // namespace cpkit::detail
