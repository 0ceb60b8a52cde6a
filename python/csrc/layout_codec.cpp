#include "layout_codec.hpp"

#include "cpkit/optimized/error.hpp"

namespace cpkit::python {

namespace {

constexpr std::int64_t kHeader = 5;

LayoutKind kind_of(std::int64_t code, const char* argument) {
  switch (code) {
    case 0:
      return LayoutKind::kContiguous;
    case 1:
      return LayoutKind::kHeadTail;
    case 2:
      return LayoutKind::kBalanced;
    default:
      raise(argument, "is not a cpkit layout: kind code ", code, " (pass the shard's \"layout\")");
  }
}

std::int64_t code_of(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kContiguous:
      return 0;
    case LayoutKind::kHeadTail:
      return 1;
    case LayoutKind::kBalanced:
      return 2;
  }
  return 0;
}

}  // namespace

at::Tensor plan_to_tensor(const LayoutPlan& plan) {
  std::vector<std::int64_t> v{code_of(plan.kind), plan.cp_size, plan.seq_len, plan.padded_len,
                              plan.local_len};
  for (const auto& rank : plan.fragments) v.push_back(static_cast<std::int64_t>(rank.size()));
  for (const auto& rank : plan.fragments)
    for (const Fragment& f : rank) v.insert(v.end(), {f.begin, f.end});
  return at::tensor(v, at::kLong);
}

std::shared_ptr<const LayoutPlan> plan_from_tensor(const at::Tensor& t, const char* argument) {
  if (!t.defined() || t.dim() != 1 || t.scalar_type() != at::kLong || t.numel() < kHeader)
    raise(argument, "is not a cpkit layout (a 1-D int64 tensor from the shard's \"layout\")");
  const at::Tensor host = t.cpu().contiguous();
  const std::int64_t* v = host.const_data_ptr<std::int64_t>();
  const std::int64_t n = host.numel();
  auto plan = std::make_shared<LayoutPlan>();
  plan->kind = kind_of(v[0], argument);
  plan->seq_len = v[2];
  plan->padded_len = v[3];
  plan->local_len = v[4];
  if (v[1] < 1 || n < kHeader + v[1] || plan->local_len * v[1] != plan->padded_len ||
      plan->seq_len < 0 || plan->seq_len > plan->padded_len)
    raise(argument, "is not a consistent cpkit layout: cp_size ", v[1], ", seq_len ", plan->seq_len,
          ", padded_len ", plan->padded_len, ", local_len ", plan->local_len);
  plan->cp_size = static_cast<int>(v[1]);
  std::int64_t at = kHeader + plan->cp_size;
  for (int r = 0; r < plan->cp_size; ++r) {
    const std::int64_t count = v[kHeader + r];
    if (count < 0 || at + 2 * count > n)
      raise(argument, "is not a consistent cpkit layout: rank ", r, " lists ", count,
            " fragments beyond its ", n, " values");
    std::vector<Fragment> fragments;
    std::int64_t owned = 0;
    for (std::int64_t k = 0; k < count; ++k, at += 2) {
      const Fragment f{v[at], v[at + 1]};
      if (f.begin < 0 || f.end <= f.begin || f.end > plan->padded_len)
        raise(argument, "is not a consistent cpkit layout: rank ", r, " fragment [", f.begin, ", ",
              f.end, ") outside [0, ", plan->padded_len, ")");
      owned += f.size();
      fragments.push_back(f);
    }
    if (owned != plan->local_len)
      raise(argument, "is not a consistent cpkit layout: rank ", r, " owns ", owned,
            " tokens, not local_len ", plan->local_len);
    plan->fragments.push_back(std::move(fragments));
  }
  if (at != n) raise(argument, "is not a consistent cpkit layout: ", n - at, " values left over");
  return plan;
}

std::vector<std::int64_t> layout_summary(const Layout& layout) {
  std::vector<std::int64_t> out{layout.seq_len, layout.padded_len, layout.local_len};
  for (const Fragment& f : layout.fragments) out.insert(out.end(), {f.begin, f.end});
  return out;
}

}  // namespace cpkit::python
