// A CPU allocator probe for memory tests: records the largest allocation made while it is
// installed (c10::SetCPUAllocator), then forwards to the allocator it wraps.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>

namespace cpkit::testing {

class LargestAllocation final : public c10::Allocator {
 public:
  explicit LargestAllocation(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    size_t seen = largest.load();
    while (n > seen && !largest.compare_exchange_weak(seen, n)) {
    }
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  std::atomic<size_t> largest{0};

 private:
  c10::Allocator* inner_;
};

}  // namespace cpkit::testing
