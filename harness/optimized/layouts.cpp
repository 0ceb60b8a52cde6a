#include "layouts.hpp"

#include "generators.hpp"

namespace cpkit::harness {

rc::Gen<MemoryLayout> gen_memory_layout() {
  return rc::gen::element(MemoryLayout::kContiguous, MemoryLayout::kTransposed,
                          MemoryLayout::kSliced, MemoryLayout::kExpanded);
}

const char* layout_name(MemoryLayout layout) {
  switch (layout) {
    case MemoryLayout::kContiguous:
      return "contiguous";
    case MemoryLayout::kTransposed:
      return "transposed";
    case MemoryLayout::kSliced:
      return "sliced";
    case MemoryLayout::kExpanded:
      return "expanded";
  }
  return "?";
}

void showValue(MemoryLayout layout, std::ostream& os) { os << layout_name(layout); }

MemoryLayout strided(MemoryLayout layout) {
  return layout == MemoryLayout::kExpanded ? MemoryLayout::kSliced : layout;
}

reference::FloatMatrix layout_values(Eigen::Index rows, Eigen::Index cols, MemoryLayout layout,
                                     std::uint64_t seed) {
  if (layout != MemoryLayout::kExpanded || rows == 0) return random_floats(rows, cols, 1, seed);
  return random_floats(1, cols, 1, seed).replicate(rows, 1);
}

at::Tensor lay_out(const at::Tensor& t, MemoryLayout layout, double junk) {
  if (t.numel() == 0 || layout == MemoryLayout::kContiguous) return t.contiguous();
  if (layout == MemoryLayout::kTransposed && t.dim() >= 2)
    return t.transpose(0, 1).contiguous().transpose(0, 1);
  if (layout == MemoryLayout::kExpanded) {
    std::vector<int64_t> sizes = t.sizes().vec();
    return t.narrow(0, 0, 1).contiguous().expand(sizes);
  }
  // Sliced: interleave with junk along the last axis, then take the even elements.
  const int64_t last = t.dim() - 1;
  const at::Tensor both = at::stack({t.contiguous(), at::full_like(t, junk)}, t.dim());
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[static_cast<std::size_t>(last)] *= 2;
  return both.reshape(sizes).slice(last, 0, sizes[static_cast<std::size_t>(last)], 2);
}

}  // namespace cpkit::harness
