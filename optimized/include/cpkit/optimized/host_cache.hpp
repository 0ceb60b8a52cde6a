// Reuse of large host (CPU) output buffers across calls, the CPU counterpart of the CUDA
// caching allocator: a training step asks for the same [B, L, V] gradient and the same shard
// shapes every time, and a fresh multi-megabyte allocation costs a page fault per 4 KiB on
// first touch (3-5x slower than writing warm memory on the benchmark machine,
// docs/performance.md). Buffers freed by cpkit's outputs wait here for the next request of
// a fitting size. CUDA tensors never come here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cpkit {

struct HostCacheStats {
  std::size_t cached_bytes = 0;  // freed, waiting for reuse
  std::size_t limit_bytes = 0;
  std::uint64_t hits = 0;    // requests served from the cache
  std::uint64_t misses = 0;  // requests that allocated new memory
};

// At most `bytes` are kept; the least recently freed buffers go first. 0 turns caching off
// (and frees what is cached). Default: $CPKIT_HOST_CACHE_BYTES, else 4 GiB; 0 in sanitizer
// builds, so every free stays visible to AddressSanitizer.
void set_host_cache_limit(std::size_t bytes);

// Frees every cached buffer now (buffers still held by tensors are unaffected).
void release_host_cache();

HostCacheStats host_cache_stats();

}  // namespace cpkit
