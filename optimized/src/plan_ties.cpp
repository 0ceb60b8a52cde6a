// Shard tensors tied to their plan: a process-wide table keyed by the tensor's TensorImpl,
// holding a weak reference so a freed tensor's entry never speaks for a new one at its address.
#include "plan_ties.hpp"

#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "cpkit/optimized/error.hpp"

namespace cpkit::detail {

namespace {

struct Tie {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  std::int64_t fingerprint;
  LayoutKind kind;
};

class Ties {
 public:
  void add(const at::Tensor& t, const Tie& tie) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (ties_.size() >= purge_at_) {  // drop freed tensors' entries; amortised O(1)
      std::erase_if(ties_, [](const auto& entry) { return entry.second.tensor.expired(); });
      purge_at_ = 2 * ties_.size() + 64;
    }
    ties_.insert_or_assign(t.unsafeGetTensorImpl(), tie);
  }

  // The live tie of `t`, if any.
  std::optional<Tie> find(const at::Tensor& t) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = ties_.find(t.unsafeGetTensorImpl());
    if (found == ties_.end()) return std::nullopt;
    const auto alive = found->second.tensor.lock();
    if (!alive || alive.get() != t.unsafeGetTensorImpl()) {
      ties_.erase(found);
      return std::nullopt;
    }
    return found->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<const c10::TensorImpl*, Tie> ties_;
  std::size_t purge_at_ = 64;
};

Ties& ties() {
  static Ties table;
  return table;
}

bool is_contiguous_plan(const LayoutPlan* plan) {
  return plan == nullptr || plan->kind == LayoutKind::kContiguous || plan->cp_size == 1;
}

// FNV-1a over 64-bit words.
void mix(std::uint64_t& h, std::int64_t v) {
  h ^= static_cast<std::uint64_t>(v);
  h *= 0x100000001B3ULL;
}

}  // namespace

std::int64_t plan_fingerprint(const LayoutPlan* plan) {
  if (is_contiguous_plan(plan)) return 0;
  std::uint64_t h = 0xCBF29CE484222325ULL;
  mix(h, static_cast<std::int64_t>(plan->kind));
  mix(h, plan->cp_size);
  mix(h, plan->seq_len);
  mix(h, plan->padded_len);
  mix(h, plan->local_len);
  for (const auto& list : plan->fragments) {
    mix(h, static_cast<std::int64_t>(list.size()));
    for (const Fragment& f : list) {
      mix(h, f.begin);
      mix(h, f.end);
    }
  }
  return h == 0 ? 1 : static_cast<std::int64_t>(h);  // 0 means contiguous
}

std::string plan_description(std::int64_t fingerprint) {
  if (fingerprint == 0) return "contiguous (no plan)";
  std::ostringstream os;
  os << "a plan with fingerprint 0x" << std::hex << static_cast<std::uint64_t>(fingerprint);
  return os.str();
}

void tie_to_plan(const at::Tensor& t, const std::shared_ptr<const LayoutPlan>& plan) {
  if (!t.defined() || is_contiguous_plan(plan.get())) return;
  ties().add(t, {c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()),
                 plan_fingerprint(plan.get()), plan->kind});
}

void check_plan_tie(const at::Tensor& t, const char* name, const LayoutPlan* plan) {
  if (!t.defined()) return;
  const std::optional<Tie> tie = ties().find(t);
  if (!tie || tie->fingerprint == plan_fingerprint(plan)) return;
  if (is_contiguous_plan(plan))
    raise("layout", "is not given, but ", name, " was cut with the \"", layout_name(tie->kind),
          "\" layout: pass the shard's plan (C++: the option layout = shard.layout.plan; "
          "Python: layout=local[\"layout\"]), or each fragment's next token is read from the "
          "wrong place");
  raise("layout", "is a \"", layout_name(plan->kind), "\" plan other than the \"",
        layout_name(tie->kind), "\" plan ", name,
        " was cut with: pass the plan of the same shard (the same microbatch)");
}

}  // namespace cpkit::detail
