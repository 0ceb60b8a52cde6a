// Padding and the padded cut of one rank's columns.
#include "pad.hpp"

#include <ATen/ATen.h>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cuda_glue.hpp"
#include "host_cache_internal.hpp"

namespace cpkit {

namespace detail {

std::int64_t padded_length(std::int64_t seq_len, int cp_size, int pad_multiple) {
  if (cp_size == 1) return seq_len;
  const std::int64_t multiple = static_cast<std::int64_t>(cp_size) * pad_multiple;
  return (seq_len + multiple - 1) / multiple * multiple;
}

}  // namespace detail

Layout shard_layout(std::int64_t seq_len, int cp_size, int rank, int pad_multiple) {
  if (cp_size < 1) raise("cp_size", "must be >= 1, got ", cp_size);
  if (rank < 0 || rank >= cp_size) raise("rank", "must be in [0, ", cp_size, "), got ", rank);
  if (pad_multiple < 1) raise("pad_multiple", "must be >= 1, got ", pad_multiple);
  if (seq_len < 1) raise("seq_len", "must be >= 1, got ", seq_len);
  Layout l;
  l.cp_size = cp_size;
  l.rank = rank;
  l.seq_len = seq_len;
  l.padded_len = detail::padded_length(seq_len, cp_size, pad_multiple);
  l.local_len = l.padded_len / cp_size;
  l.begin = rank * l.local_len;
  l.end = l.begin + l.local_len;
  return l;
}

at::Tensor cut_columns(const at::Tensor& x, const Layout& l, double fill) {
  // A shard inside [0, S) is a plain cut: a view where it is already contiguous (B = 1),
  // one copy otherwise; each output element is written once.
  const int64_t start = std::min(l.begin, l.seq_len);
  const at::Tensor cut = x.narrow(1, start, std::clamp<int64_t>(l.seq_len - start, 0, l.local_len));
  if (cut.size(1) == l.local_len && cut.is_contiguous()) return cut;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[1] = l.local_len;
  at::Tensor out = detail::empty_reusable(sizes, x.options());
  const at::Tensor real = out.narrow(1, 0, cut.size(1));
  if (!(x.is_cuda() && detail::copy_rows_2d(real, cut))) real.copy_(cut);  // GPU: one 2-D copy
  out.narrow(1, cut.size(1), l.local_len - cut.size(1)).fill_(fill);
  return out;
}

at::Tensor cut_columns_backward(const at::Tensor& grad, const Layout& l) {
  std::vector<int64_t> sizes = grad.sizes().vec();
  sizes[1] = l.seq_len;
  at::Tensor full = at::zeros(sizes, grad.options());
  const int64_t real = std::clamp<int64_t>(l.seq_len - l.begin, 0, grad.size(1));
  if (real > 0) full.narrow(1, l.begin, real).copy_(grad.narrow(1, 0, real));
  return full;  // the gradient of the zero padding is dropped
}

}  // namespace cpkit
