// The machine's own limit: memcpy of N bytes (counted as N read + N written).
#include <cstring>
#include <vector>

#include "bench_util.hpp"

namespace {

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  cpkit::bench::set_bytes(state, 2.0 * static_cast<double>(bytes));
}

BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(1 << 20, 1 << 30)->Unit(benchmark::kMillisecond);

}  // namespace
