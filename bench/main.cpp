// cpkit-bench: reference vs optimized vs plain LibTorch, and memcpy as the machine's limit.
// Run: build/bench/cpkit-bench --benchmark_format=json > results.json; bench/plot results.json
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <string>
#include <thread>

#include "rank_pool.hpp"

int main(int argc, char** argv) {
  // LibTorch defaults to one intra-op thread here; use every core for both contenders.
  at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
  benchmark::AddCustomContext("intra_op_threads", std::to_string(at::get_num_threads()));
  // Fork the Gloo rank processes before any LibTorch thread pool exists.
  bool gather = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg.rfind("--benchmark_filter=", 0) == 0 && arg.find("Gather") == std::string::npos) ||
        arg.rfind("--benchmark_list_tests", 0) == 0)
      gather = false;
  }
  if (gather) cpkit::pool::RankPool::instance();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
