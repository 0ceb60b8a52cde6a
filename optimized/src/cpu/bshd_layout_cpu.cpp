// CPU loop of a BSHD shard's token streams (kernels/bshd_layout.hpp).
#include <ATen/Parallel.h>

#include "kernels/bshd_layout.hpp"

namespace cpkit::kernels {

void bshd_layout_cpu(const BshdLayoutArgs& args) {
  // Grain: a shard of tens of thousands of tokens is done before a second thread would wake.
  at::parallel_for(0, args.rows * args.count, 65536, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) bshd_token(args, i / args.count, i % args.count);
  });
}

}  // namespace cpkit::kernels
