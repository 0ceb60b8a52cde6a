// The plan index cache: a small LRU list keyed by the plan's full contents.
#include "plan_index_cache.hpp"

#include <ATen/ATen.h>

#include <list>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_glue.hpp"
#include "plan_ties.hpp"

namespace cpkit::detail {

namespace {

// Contiguous plans share fingerprint 0, so their lengths are part of the key too.
using Key = std::tuple<std::int64_t, int, std::int64_t, std::int64_t, int, std::string,
                       at::DeviceType, at::DeviceIndex>;

struct Entry {
  Key key;
  at::Tensor index;
};

}  // namespace

at::Tensor cached_plan_index(const LayoutPlan& plan, int rank, const char* what,
                             const at::Device& device,
                             const std::function<std::vector<std::int64_t>()>& build) {
  static std::mutex mutex;
  static std::list<Entry> entries;  // most recently used first
  const Key key{plan_fingerprint(&plan), plan.cp_size,  plan.padded_len, plan.local_len, rank, what,
                device.type(),           device.index()};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it->key == key) {
        entries.splice(entries.begin(), entries, it);
        return it->index;
      }
  }
  const at::Tensor index = upload(at::tensor(build(), at::kLong), device, what);
  const std::lock_guard<std::mutex> lock(mutex);
  entries.push_front({key, index});
  if (entries.size() > kPlanIndexCacheEntries) entries.pop_back();
  return index;
}

}  // namespace cpkit::detail
