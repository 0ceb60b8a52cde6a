// Packed rows for the attention benchmarks: lognormal document lengths (the long-tailed mix
// of a pretraining corpus) and the batch a row of documents makes.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpkit/optimized/batch.hpp"

namespace cpkit::bench {

// `rows` rows of document lengths, each filling `tokens`: lognormal around a median of 1000
// (sigma 1.2), one distribution over all rows (its cached normal draw carries across rows, so
// the rows depend on the seed and `rows` alone).
inline std::vector<std::vector<int64_t>> lognormal_rows(int64_t rows, int64_t tokens,
                                                        std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> length(std::log(1000.0), 1.2);
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> docs;
    for (int64_t used = 0; used < tokens;) {
      const int64_t n =
          std::min<int64_t>(std::max<int64_t>(1, static_cast<int64_t>(length(rng))), tokens - used);
      docs.push_back(n);
      used += n;
    }
    out.push_back(docs);
  }
  return out;
}

// One packed (THD) row of these documents, no slot padding.
inline CPBatch packed_row(const std::vector<int64_t>& docs) {
  int64_t tokens = 0;
  for (const int64_t n : docs) tokens += n;
  CPBatch b;
  b.input_ids = at::ones({1, tokens}, at::kLong);
  b.labels = b.input_ids.clone();
  b.seq_lens = at::tensor(docs, at::kLong).unsqueeze(0);
  b.seq_lens_padded = b.seq_lens.clone();
  b.qkv_format = "thd";
  return b;
}

}  // namespace cpkit::bench
