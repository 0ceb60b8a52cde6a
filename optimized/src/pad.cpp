// A rank's Layout, and the padded cut of its fragments' columns.
#include <ATen/ATen.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cuda_glue.hpp"
#include "host_cache_internal.hpp"

namespace cpkit {

Layout layout_of(const std::shared_ptr<const LayoutPlan>& plan, int rank) {
  if (!plan) raise("layout", "has no plan");
  if (rank < 0 || rank >= plan->cp_size)
    raise("rank", "must be in [0, ", plan->cp_size, "), got ", rank);
  Layout l;
  l.cp_size = plan->cp_size;
  l.rank = rank;
  l.seq_len = plan->seq_len;
  l.padded_len = plan->padded_len;
  l.local_len = plan->local_len;
  l.fragments = plan->fragments[static_cast<std::size_t>(rank)];
  l.plan = plan;
  return l;
}

Layout shard_layout(std::int64_t seq_len, int cp_size, int rank, int pad_multiple,
                    LayoutKind kind) {
  if (rank < 0 || rank >= std::max(cp_size, 1))
    raise("rank", "must be in [0, ", cp_size, "), got ", rank);
  return layout_of(
      std::make_shared<const LayoutPlan>(plan_layout(kind, seq_len, cp_size, pad_multiple)), rank);
}

at::Tensor cut_columns(const at::Tensor& x, const Layout& l, double fill) {
  // One fragment inside [0, S) is a plain cut: a view where it is already contiguous (B = 1).
  if (l.fragments.size() == 1) {
    const Fragment& f = l.fragments.front();
    if (f.end <= l.seq_len) {
      const at::Tensor cut = x.narrow(1, f.begin, f.size());
      if (cut.is_contiguous()) return cut;
    }
  }
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[1] = l.local_len;
  at::Tensor out = detail::empty_reusable(sizes, x.options());
  int64_t offset = 0;
  for (const Fragment& f : l.fragments) {
    // Each output element is written once: the part inside [0, S) copied, the rest filled.
    const int64_t real = std::clamp<int64_t>(l.seq_len - f.begin, 0, f.size());
    if (real > 0) {
      const at::Tensor cut = x.narrow(1, f.begin, real);
      const at::Tensor dst = out.narrow(1, offset, real);
      if (!(x.is_cuda() && detail::copy_rows_2d(dst, cut))) dst.copy_(cut);  // GPU: a 2-D copy
    }
    if (real < f.size()) out.narrow(1, offset + real, f.size() - real).fill_(fill);
    offset += f.size();
  }
  return out;
}

at::Tensor cut_columns_backward(const at::Tensor& grad, const Layout& l) {
  std::vector<int64_t> sizes = grad.sizes().vec();
  sizes[1] = l.seq_len;
  at::Tensor full = at::zeros(sizes, grad.options());
  int64_t offset = 0;
  for (const Fragment& f : l.fragments) {
    const int64_t real = std::clamp<int64_t>(l.seq_len - f.begin, 0, f.size());
    if (real > 0) full.narrow(1, f.begin, real).copy_(grad.narrow(1, offset, real));
    offset += f.size();
  }
  return full;  // the gradient of the zero padding is dropped
}

}  // namespace cpkit
