// What planned packed rows cost (bench helpers): the largest cost over the mean, a row's
// attention documents and, per rank, the keys its queries need from other ranks (spec 4b
// without a window).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpkit/optimized/layout.hpp"

namespace cpkit::bench {

// The largest of per-rank (or per-row) costs over their mean.
inline double max_over_mean(const std::vector<double>& costs) {
  double most = 0, sum = 0;
  for (const double c : costs) {
    most = std::max(most, c);
    sum += c;
  }
  return most / (sum / static_cast<double>(costs.size()));
}

// The attention documents of a planned row: its documents, then any padding tail.
inline std::vector<int64_t> attention_docs(std::vector<int64_t> docs, const cpkit::LayoutPlan& p) {
  int64_t T = 0;
  for (const int64_t n : docs) T += n;
  if (p.padded_len > T) docs.push_back(p.padded_len - T);
  return docs;
}

// Per rank, the keys its queries need from other ranks (spec 4b without a window): in each
// attention document, the positions before its last query there that it does not own.
inline std::vector<double> needed_keys(const cpkit::LayoutPlan& p,
                                       const std::vector<int64_t>& docs) {
  std::vector<int64_t> starts{0};
  for (const int64_t n : docs) starts.push_back(starts.back() + n);
  std::vector<double> out;
  for (const auto& list : p.fragments) {
    double needed = 0;
    std::size_t d = 0;
    int64_t owned = 0, last = -1;
    auto close = [&] {
      if (last >= 0) needed += static_cast<double>(last + 1 - starts[d] - owned);
      owned = 0;
      last = -1;
    };
    for (const cpkit::Fragment& f : list)
      for (int64_t t = f.begin; t < f.end;) {
        while (t >= starts[d + 1]) {
          close();
          ++d;
        }
        const int64_t e = std::min(f.end, starts[d + 1]);
        owned += e - t;
        last = e - 1;
        t = e;
      }
    close();
    out.push_back(needed);
  }
  return out;
}

}  // namespace cpkit::bench
