// One row of S tokens cut contiguously onto CP ranks, for the reference's properties of the
// fused head (linear loss, token log-probabilities).
#pragma once

#include <rapidcheck.h>

#include <vector>

#include "generators.hpp"

namespace cpkit::harness {

struct Split {
  std::vector<reference::FloatMatrix> hidden;
  std::vector<reference::IntMatrix> labels;
  std::vector<reference::BoolVector> valid;
};

// hidden [S, H] and labels [1, S] on `cp` ranks of L = S / cp; valid wherever a label counts.
inline Split split(const reference::FloatMatrix& hidden, const reference::IntMatrix& labels,
                   int cp) {
  const auto L = labels.cols() / cp;
  Split out;
  for (int r = 0; r < cp; ++r) {
    out.hidden.push_back(hidden.middleRows(r * L, L));
    out.labels.push_back(labels.middleCols(r * L, L));
    reference::BoolVector v(L);
    for (Eigen::Index j = 0; j < L; ++j) v(j) = out.labels.back()(0, j) != reference::kIgnoreLabel;
    out.valid.push_back(v);
  }
  return out;
}

// Labels [1, S] in [0, V), a third of them -100 (drawn by RapidCheck: they shrink).
inline reference::IntMatrix random_labels(int S, int V) {
  reference::IntMatrix labels(1, S);
  for (int t = 0; t < S; ++t) {
    const std::int64_t label = *rc::gen::inRange(0, V);
    labels(0, t) = *rc::gen::element(reference::kIgnoreLabel, label, label);
  }
  return labels;
}

}  // namespace cpkit::harness
