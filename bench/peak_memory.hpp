// Measured peak memory of one call: the kernel's high-water mark of this process's resident
// set (VmHWM, reset through /proc/self/clear_refs) above the resident set before the call.
// Linux only; freed memory must go back to the kernel for the baseline to mean anything, so
// glibc is told to return every large block (no dynamic mmap threshold) and cpkit's host
// cache is emptied first.
#pragma once

#include <malloc.h>

#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "cpkit/optimized/host_cache.hpp"

namespace cpkit::bench {

// kB of a /proc/self/status line ("VmRSS", "VmHWM").
inline double status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1));
  throw std::runtime_error("/proc/self/status has no " + key);
}

// Blocks of 1 MiB and more are mmapped and unmapped on free, and the heap is trimmed: what
// a call frees leaves the resident set. Called once, before any measurement.
inline void return_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
}

// Bytes by which the resident set peaked above its level before `step`.
inline double peak_bytes_above_baseline(const std::function<void()>& step) {
  release_host_cache();
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current VmRSS
  const double before = status_kb("VmRSS");
  step();
  return (status_kb("VmHWM") - before) * 1024.0;
}

}  // namespace cpkit::bench
