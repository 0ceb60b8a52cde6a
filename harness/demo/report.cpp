#include <cmath>
#include <iomanip>

#include "demo.hpp"

namespace cpkit::demo {

namespace {

template <class Row>
void print_row(std::ostream& os, const char* name, const Row& row) {
  os << "  " << std::left << std::setw(10) << name << std::right;
  for (Eigen::Index j = 0; j < row.size(); ++j) os << std::setw(5) << row(j);
  os << "\n";
}

}  // namespace

void print_report(const DemoOptions& options, const reference::PackedBatch& batch,
                  const DemoResult& result, std::ostream& os) {
  os << "cpkit-demo (" << options.impl << "): CP = " << options.cp
     << ", T = " << batch.labels.cols() << ", documents (length/slot):";
  for (Eigen::Index d = 0; d < batch.seq_lens.cols(); ++d)
    os << " " << batch.seq_lens(0, d) << "/" << batch.seq_lens_padded(0, d);
  os << ", row tail " << options.tail << ", V = " << options.vocab << "\n\n";

  for (std::size_t r = 0; r < result.shards.size(); ++r) {
    const auto& s = result.shards[r];
    os << "rank " << r << ": tokens [" << s.layout.begin << ", " << s.layout.end << ") of "
       << s.layout.padded_len << " (T = " << s.layout.seq_len << ")\n";
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
  const bool shards_equal = *a.input_ids == *b.input_ids && a.labels == b.labels &&
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
