#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <vector>

#include "demo.hpp"

namespace cpkit::demo {

namespace {

template <class Row>
void print_row(std::ostream& os, const char* name, const Row& row) {
  os << "  " << std::left << std::setw(10) << name << std::right;
  for (Eigen::Index j = 0; j < row.size(); ++j) os << std::setw(5) << row(j);
  os << "\n";
}

// Each global position's attention document start (spec 2b step 1: the nonzero slots, then
// the row tail).
std::vector<std::int64_t> document_starts(const reference::PackedBatch& batch,
                                          std::int64_t padded_len) {
  std::vector<std::int64_t> start(static_cast<std::size_t>(padded_len));
  std::int64_t at = 0;
  for (Eigen::Index d = 0; d < batch.seq_lens_padded.cols(); ++d) {
    for (std::int64_t i = 0; i < batch.seq_lens_padded(0, d); ++i)
      start[static_cast<std::size_t>(at + i)] = at;
    at += batch.seq_lens_padded(0, d);
  }
  for (std::int64_t t = at; t < padded_len; ++t) start[static_cast<std::size_t>(t)] = at;
  return start;
}

// The rank's fragments (runs of consecutive positions), its causal work (each token attends
// its offset in its document + 1 keys) and the keys its queries need that other ranks own.
void print_placement(std::ostream& os, const std::vector<std::int64_t>& positions,
                     const std::vector<std::int64_t>& start, int cp) {
  os << "  fragments";
  for (std::size_t i = 0; i < positions.size();) {
    std::size_t j = i + 1;
    while (j < positions.size() && positions[j] == positions[j - 1] + 1) ++j;
    os << " [" << positions[i] << ", " << positions[j - 1] + 1 << ")";
    i = j;
  }
  std::int64_t work = 0, needed = 0;
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> per_document;  // last, owned
  for (const std::int64_t p : positions) {
    const std::int64_t s = start[static_cast<std::size_t>(p)];
    work += p - s + 1;
    auto& [last, owned] = per_document[s];
    last = std::max(last, p);
    owned += 1;
  }
  for (const auto& [s, d] : per_document) needed += d.first + 1 - s - d.second;
  const auto all_gather = static_cast<double>((cp - 1) * std::ssize(positions));
  os << "; work " << work << "; keys needed from other ranks " << needed;
  if (cp > 1)
    os << " (" << std::setprecision(3) << 100.0 * needed / all_gather << " % of an all-gather)";
  os << "\n";
}

}  // namespace

void print_report(const DemoOptions& options, const reference::PackedBatch& batch,
                  const DemoResult& result, std::ostream& os) {
  os << "cpkit-demo (" << options.impl << ", " << options.layout << "): CP = " << options.cp
     << ", T = " << batch.labels.cols() << ", documents (length/slot):";
  for (Eigen::Index d = 0; d < batch.seq_lens.cols(); ++d)
    os << " " << batch.seq_lens(0, d) << "/" << batch.seq_lens_padded(0, d);
  os << ", row tail " << options.tail << ", V = " << options.vocab << "\n\n";

  const std::vector<std::int64_t> start =
      document_starts(batch, result.shards.front().layout.padded_len);
  for (std::size_t r = 0; r < result.shards.size(); ++r) {
    const auto& s = result.shards[r];
    os << "rank " << r << ": " << s.layout.local_len << " of " << s.layout.padded_len
       << " tokens (T = " << s.layout.seq_len << ")\n";
    print_placement(os, s.layout.positions, start, options.cp);
    print_row(os, "ids", s.input_ids->row(0));
    print_row(os, "labels", s.labels.row(0));
    print_row(os, "positions", s.position_ids.row(0));
    print_row(os, "documents", s.document_ids.row(0));
    print_row(os, "padding", s.padding.row(0).cast<int>());
    print_row(os, "valid", s.valid.cast<int>().transpose());
    const auto& loss = result.losses[r];
    os << "  loss " << std::setprecision(9) << loss.value;
    if (loss.global_targets >= 0)
      os << " over " << loss.local_targets << " of " << loss.global_targets << " targets";
    os << "\n\n";
  }
  const double diff = result.combined - result.single_device;
  os << std::setprecision(12) << "combined loss (mean over ranks): " << result.combined << "\n"
     << "single-device loss:              " << result.single_device << "\n"
     << "difference:                      " << std::setprecision(3) << diff << "\n";
}

bool same_rank(const reference::LocalShard& a, double loss_a, const reference::LocalShard& b,
               double loss_b, std::ostream& os) {
  const bool shards_equal = a.layout.positions == b.layout.positions &&
                            *a.input_ids == *b.input_ids && a.labels == b.labels &&
                            a.position_ids == b.position_ids && a.document_ids == b.document_ids &&
                            a.padding == b.padding && a.valid == b.valid;
  const double diff = loss_a - loss_b;
  const bool loss_close = std::abs(diff) <= 1e-5 * (1 + std::abs(loss_b));  // NaN fails
  os << "shards " << (shards_equal ? "identical" : "DIFFER") << ", loss difference "
     << std::setprecision(3) << diff << (loss_close ? "" : " (too large)") << "\n";
  return shards_equal && loss_close;
}

bool same_result(const DemoResult& optimized, const DemoResult& reference, std::ostream& os) {
  bool ok = true;
  for (std::size_t r = 0; r < reference.shards.size(); ++r) {
    os << "  rank " << r << ": ";
    ok = same_rank(optimized.shards[r], optimized.losses[r].value, reference.shards[r],
                   reference.losses[r].value, os) &&
         ok;
  }
  return ok;
}

}  // namespace cpkit::demo
