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

// Document lengths filling `tokens`: lognormal around a median of 1000 (sigma 1.2).
inline std::vector<int64_t> lognormal_documents(int64_t tokens, std::mt19937_64& rng) {
  std::lognormal_distribution<double> length(std::log(1000.0), 1.2);
  std::vector<int64_t> docs;
  for (int64_t used = 0; used < tokens;) {
    const int64_t n =
        std::min<int64_t>(std::max<int64_t>(1, static_cast<int64_t>(length(rng))), tokens - used);
    docs.push_back(n);
    used += n;
  }
  return docs;
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
