// Shared pieces of cpkit-bench: counters and the memcpy line.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>

namespace cpkit::bench {

// bytes/s at read-once/write-once accounting, and the bytes each iteration moves.
inline void set_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["bytes_per_second"] = benchmark::Counter(
      bytes_per_iteration * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["bytes"] = bytes_per_iteration;
}

}  // namespace cpkit::bench
