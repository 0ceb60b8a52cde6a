// CPU kernel of the fused shifted cross-entropy: rows in parallel, each row read once for
// its online softmax and once more to write the gradient.
#include <ATen/Parallel.h>

#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace cpkit::kernels {

void cross_entropy_cpu(const CrossEntropyArgs& a) {
  // Rows are independent and each is written by one thread: results do not depend on the
  // thread count.
  const float scale = *a.count > 0 ? static_cast<float>(a.cp) / static_cast<float>(*a.count) : 0.0f;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, a.vocab));
  at::parallel_for(0, a.rows, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const float* z = a.logits + row * a.vocab;
      float* g = a.grad + row * a.vocab;
      const std::int64_t target = a.targets[row];
      if (target == kNoTarget) {
        for (std::int64_t i = 0; i < a.vocab; ++i) g[i] = 0.0f;
        a.row_loss[row] = 0.0f;
        continue;
      }
      OnlineSoftmax s = online_empty();
      for (std::int64_t i = 0; i < a.vocab; ++i) online_add(s, capped(z[i], a.softcap));
      const float lse = log_sum_exp(s);
      for (std::int64_t i = 0; i < a.vocab; ++i)
        g[i] = cross_entropy_grad(z[i], i == target, lse, a.softcap, scale);
      a.row_loss[row] = lse - capped(z[target], a.softcap);
    }
  });
}

}  // namespace cpkit::kernels
