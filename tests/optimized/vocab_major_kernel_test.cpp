// The CPU cross-entropy kernel on vocab-major logits ([V, rows], the fused head's CPU layout,
// cpu/vocab_major.hpp) against PyTorch in double: every row's loss and gradient, in place,
// for token counts that leave partial lane groups, vocabularies that leave partial blocks,
// masked entries, the soft cap, rows without a target (0) and targets outside the
// vocabulary (NaN, as the row-major kernel), and vocabularies on the edge of the kernel's
// slices (a whole number of slices, and one entry into the next).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "cpkit/optimized/constants.hpp"
#include "cpu/vocab_slices.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cross_entropy_launch.hpp"

namespace cpkit::kernels {
namespace {

TEST(VocabMajorKernel, CrossEntropyMatchesTorchInDouble) {
  for (const int64_t V : {int64_t{33}, int64_t{1500}, 2 * kVocabSlice, 2 * kVocabSlice + 1}) {
    for (const int64_t rows : {1, 70, 129}) {
      for (const double softcap : {0.0, 5.0}) {
        const std::string where = "V " + std::to_string(V) + ", rows " + std::to_string(rows) +
                                  ", softcap " + std::to_string(softcap);
        at::manual_seed(V * 1000 + rows);
        at::Tensor z = at::randn({rows, V}) * 3;
        z.masked_fill_(at::rand({rows, V}) < 0.2, -INFINITY);
        at::Tensor targets = at::randint(0, V, {rows}, at::kLong);
        for (int64_t r = 0; r < rows; ++r) {
          if (r % 7 == 3) targets[r] = kIgnoreLabel;
          if (r % 11 == 5) targets[r] = V;  // outside the vocabulary
        }
        // Every row keeps its target unmasked.
        const at::Tensor safe = targets.clamp(0, V - 1);
        z.scatter_(1, safe.unsqueeze(1), at::randn({rows, 1}));
        const int64_t count = 17, cp = 3;
        at::Tensor buffer = z.t().contiguous().clone();  // [V, rows], never z itself
        at::Tensor row_loss = at::empty({rows}), scale = at::empty({1});
        const at::Tensor n = at::full({1}, count, at::kLong);
        CrossEntropyArgs a{};
        a.logits = buffer.data_ptr<float>();
        a.targets = targets.data_ptr<int64_t>();
        a.rows = rows;
        a.vocab = V;
        a.softcap = static_cast<float>(softcap);
        a.cp = cp;
        a.count = n.data_ptr<int64_t>();
        a.grad = buffer.data_ptr<float>();
        a.row_loss = row_loss.data_ptr<float>();
        a.scale = scale.data_ptr<float>();
        a.vocab_major = true;
        cross_entropy_cpu(a);
        const at::Tensor grad = buffer.t();  // [rows, V]

        // Truth: double, capped logits c, softmax p, CE = lse - c_t, d/dz = s (p - onehot) c'.
        const at::Tensor zd = z.to(at::kDouble);
        const at::Tensor c = softcap > 0 ? softcap * at::tanh(zd / softcap) : zd;
        const at::Tensor lse = at::logsumexp(c, 1);
        const at::Tensor p = at::exp(c - lse.unsqueeze(1));
        const double s = static_cast<double>(cp) / count;
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE(where + ", row " + std::to_string(r));
          const int64_t t = targets[r].item<int64_t>();
          if (t == kIgnoreLabel) {
            EXPECT_EQ(row_loss[r].item<float>(), 0.0f);
            EXPECT_TRUE(grad[r].eq(0).all().item<bool>());
            continue;
          }
          if (t == V) {
            EXPECT_TRUE(std::isnan(row_loss[r].item<float>()));
            EXPECT_TRUE(grad[r].isnan().all().item<bool>());
            continue;
          }
          const double want = (lse[r] - c[r][t]).item<double>();
          EXPECT_NEAR(row_loss[r].item<float>(), want, 2e-5 * (1 + std::abs(want)));
          at::Tensor g = p[r].clone();
          g[t] -= 1.0;
          g = g * s;
          if (softcap > 0) g = g * (1 - at::square(at::tanh(zd[r] / softcap)));
          const at::Tensor got = grad[r].to(at::kDouble);
          ASSERT_FALSE(got.isnan().any().item<bool>());
          EXPECT_LE((got - g).abs().max().item<double>(), 2e-6);
          EXPECT_EQ(scale.item<float>(), static_cast<float>(s));
        }
      }
    }
  }
}

}  // namespace
}  // namespace cpkit::kernels
