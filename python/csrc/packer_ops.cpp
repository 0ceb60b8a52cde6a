// pack_documents as torch.ops.cpkit.pack_documents (cpkit/optimized/packer.hpp): a data
// loader's helper on plain integers, no tensors.
#include <torch/library.h>

#include "cpkit/optimized/packer.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

std::vector<int64_t> pack_documents_op(const std::vector<int64_t>& lengths, int64_t rows,
                                       int64_t capacity, int64_t window) {
  return checked([&] { return pack_documents(lengths, rows, capacity, window); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cpkit, m) {
  m.def("pack_documents(int[] lengths, int rows, int capacity, int window=0) -> int[]",
        &pack_documents_op);
}

}  // namespace cpkit::python
