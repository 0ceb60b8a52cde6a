// The host buffer cache: mmap'd blocks handed out as tensor storage, kept on free (up to a
// limit, least recently freed evicted first) and handed out again to a request that fits.
#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cstdlib>
#include <list>
#include <mutex>
#include <new>

#include "cpkit/optimized/host_cache.hpp"
#include "host_cache_internal.hpp"

namespace cpkit {

namespace {

constexpr std::size_t kMinBytes = std::size_t{1} << 20;  // smaller ones: malloc reuses them
constexpr std::size_t kGranule = std::size_t{64} << 10;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::size_t default_limit() {
  if (kSanitized) return 0;
  if (const char* env = std::getenv("CPKIT_HOST_CACHE_BYTES"))
    return std::strtoull(env, nullptr, 10);
  return std::size_t{4} << 30;
}

struct Block {
  void* data;
  std::size_t capacity;
};

class HostCache {
 public:
  // A block of at least `bytes`: a cached one no more than 1/8 larger, else a new mapping.
  Block acquire(std::size_t bytes) {
    const std::size_t capacity = (bytes + kGranule - 1) / kGranule * kGranule;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity >= capacity && it->capacity <= capacity + capacity / 8 &&
            (best == free_.end() || it->capacity < best->capacity))
          best = it;
      if (best != free_.end()) {
        const Block b = *best;
        cached_ -= b.capacity;
        free_.erase(best);
        ++hits_;
        return b;
      }
      ++misses_;
    }
    void* data =
        mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) throw std::bad_alloc();
    return {data, capacity};
  }

  void give_back(Block b) {
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (b.capacity <= limit_) {
        free_.push_back(b);  // most recently freed at the back
        cached_ += b.capacity;
      } else {
        evicted.push_back(b);
      }
      trim_locked(evicted);
    }
    for (const Block& e : evicted) munmap(e.data, e.capacity);  // outside the lock
  }

  void set_limit(std::size_t bytes) {
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
      trim_locked(evicted);
    }
    for (const Block& e : evicted) munmap(e.data, e.capacity);
  }

  void release_all() {
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evicted.splice(evicted.end(), free_);
      cached_ = 0;
    }
    for (const Block& e : evicted) munmap(e.data, e.capacity);
  }

  HostCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {cached_, limit_, hits_, misses_};
  }

 private:
  void trim_locked(std::list<Block>& evicted) {
    while (cached_ > limit_) {
      cached_ -= free_.front().capacity;
      evicted.splice(evicted.end(), free_, free_.begin());
    }
  }

  std::mutex mutex_;
  std::list<Block> free_;
  std::size_t cached_ = 0;
  std::size_t limit_ = default_limit();
  std::uint64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: tensors freed after main() returns still give their block back.
HostCache& cache() {
  static HostCache* instance = new HostCache;
  return *instance;
}

}  // namespace

void set_host_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }
void release_host_cache() { cache().release_all(); }
HostCacheStats host_cache_stats() { return cache().stats(); }

namespace detail {

at::Tensor empty_reusable(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().type() != at::kCPU || cache().stats().limit_bytes == 0)
    return at::empty(sizes, options);
  std::size_t bytes = options.dtype().itemsize();
  for (const int64_t s : sizes) {
    if (s < 0) return at::empty(sizes, options);  // let ATen name the bad size
    if (s != 0 && bytes > SIZE_MAX / static_cast<std::size_t>(s)) throw std::bad_alloc();
    bytes *= static_cast<std::size_t>(s);
  }
  if (bytes < kMinBytes) return at::empty(sizes, options);
  const Block block = cache().acquire(bytes);
  return at::from_blob(
      block.data, sizes, [block](void*) { cache().give_back(block); }, options);
}

}  // namespace detail

}  // namespace cpkit
