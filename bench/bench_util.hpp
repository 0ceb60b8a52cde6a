// Shared pieces of cpkit-bench: counters and the memcpy line.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>

#include "cpkit/optimized/host_cache.hpp"

namespace cpkit::bench {

// bytes/s at read-once/write-once accounting, and the bytes each iteration moves.
inline void set_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["bytes_per_second"] = benchmark::Counter(
      bytes_per_iteration * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["bytes"] = bytes_per_iteration;
}

// The host buffer cache turned off for one benchmark: every output is a fresh allocation
// that pays its first-touch page faults (a trainer's first step, or a shape seen once).
class HostCacheOff {
 public:
  HostCacheOff() : limit_(host_cache_stats().limit_bytes) { set_host_cache_limit(0); }
  ~HostCacheOff() { set_host_cache_limit(limit_); }
  HostCacheOff(const HostCacheOff&) = delete;
  HostCacheOff& operator=(const HostCacheOff&) = delete;

 private:
  std::size_t limit_;
};

}  // namespace cpkit::bench
