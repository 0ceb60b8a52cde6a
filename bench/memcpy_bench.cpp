// The machine's own limit: memcpy of N bytes (counted as N read + N written), split over the
// same intra-op threads the contenders use (one thread's memcpy does not saturate memory).
#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.hpp"

namespace {

void parallel_memcpy(char* dst, const char* src, std::size_t bytes) {
  at::parallel_for(0, static_cast<int64_t>(bytes), int64_t{1} << 20, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<std::size_t>(e - b));
  });
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    parallel_memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  cpkit::bench::set_bytes(state, 2.0 * static_cast<double>(bytes));
}

// The limit for producing a *new* tensor: the destination is freshly allocated each time,
// so its first-touch page faults are paid, as every contender that returns a new tensor does.
void BM_MemcpyFresh(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(bytes, 1);
  for (auto _ : state) {
    char* dst = static_cast<char*>(std::malloc(bytes));
    parallel_memcpy(dst, src.data(), bytes);
    benchmark::DoNotOptimize(dst);
    std::free(dst);
  }
  cpkit::bench::set_bytes(state, 2.0 * static_cast<double>(bytes));
}

BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(1 << 20, 1 << 30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyFresh)
    ->RangeMultiplier(4)
    ->Range(1 << 20, 1 << 30)
    ->Unit(benchmark::kMillisecond);

}  // namespace
