// Targets of the shifted loss: checks, the shift with the boundary halo, the global count.
#include "loss_targets.hpp"

#include <ATen/ATen.h>

#include <functional>
#include <unordered_map>
#include <vector>

#include "agreement.hpp"
#include "cpkit/optimized/constants.hpp"
#include "fault_injection.hpp"
#include "plan_index_cache.hpp"
#include "plan_ties.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

void check_targets_inputs(const at::Tensor& labels, const at::Tensor& valid,
                          const at::Tensor& source, const char* source_name, int64_t vocab) {
  require_defined(labels, "labels");
  require_defined(valid, "valid");
  require_dim(labels, 2, "labels");
  require_dtype(labels, at::kLong, "labels");
  require_dim(valid, 1, "valid");
  require_dtype(valid, at::kBool, "valid");
  const int64_t B = source.size(0), L = source.size(1);
  if (labels.size(0) != B || labels.size(1) != L)
    raise("labels", "has shape ", shape_of(labels), " but ", source_name, " need [", B, ", ", L,
          "]");
  if (valid.numel() != B * L) raise("valid", "has ", valid.numel(), " entries but B * L = ", B * L);
  if (labels.device() != source.device() || valid.device() != source.device())
    raise("labels", source_name, ", labels and valid must share a device, got ", source.device(),
          ", ", labels.device(), ", ", valid.device());
  if (!check_values_of(labels)) return;  // the kernels turn a stray label into NaN
  const at::Tensor outside = (labels != kIgnoreLabel) & ((labels < 0) | (labels >= vocab));
  if (outside.any().item<bool>()) {
    const auto at_index = outside.flatten().nonzero()[0][0].item<int64_t>();
    raise("labels", "value ", labels.flatten()[at_index].item<int64_t>(), " at [", at_index / L,
          ", ", at_index % L, "] is outside the vocabulary [0, ", vocab, ") and not ",
          kIgnoreLabel);
  }
  const at::Tensor bad_valid = valid & (labels.flatten() == kIgnoreLabel);
  if (bad_valid.any().item<bool>())
    raise("valid", "marks token ", bad_valid.nonzero()[0][0].item<int64_t>(),
          " valid but its label is ", kIgnoreLabel);
}

// targets[b, j]: the label position j predicts, -100 when it counts nothing. Contiguous:
// the last column comes from the next rank's first column (one halo exchange).
at::Tensor shifted_targets(const at::Tensor& counted, const MeshPtr& mesh) {
  const int64_t B = counted.size(0), L = counted.size(1);
  const at::TensorOptions opts = counted.options();
  at::Tensor targets = at::empty({B, L}, opts);
  targets.narrow(1, 0, L - 1).copy_(counted.narrow(1, 1, L - 1));
  at::Tensor halo = at::full({B}, kIgnoreLabel, opts);
  if (cp_size(mesh) > 1 && !fault("boundary_label_dropped")) {
    const at::Tensor first = counted.select(1, 0).contiguous();
    mesh->shift_from_next(first.data_ptr(), halo.data_ptr(), static_cast<std::size_t>(B),
                          ScalarKind::kInt64);
  }
  targets.select(1, L - 1).copy_(halo);
  return targets;
}

// Several fragments per rank: the last token of each predicts the token at the fragment's
// global end, which starts a fragment of another rank (a rank's adjacent fragments are
// merged). One all-gather of every rank's fragment-first labels serves all of them; the
// columns sent, the received row each halo comes from and the columns it lands in are index
// tensors cached per plan and device (plan_index_cache.hpp), so the exchange costs a fixed
// handful of launches however many fragments a rank holds, and no host-to-device copy.
at::Tensor shifted_targets(const at::Tensor& counted, const MeshPtr& mesh, const LayoutPlan& plan) {
  const int64_t B = counted.size(0), L = counted.size(1);
  const int cp = plan.cp_size, rank = cp_rank(mesh);
  std::size_t most = 0;  // fragments of the rank holding the most
  for (const auto& list : plan.fragments) most = std::max(most, list.size());
  const auto F = static_cast<int64_t>(most);
  const auto& mine = plan.fragments[static_cast<std::size_t>(rank)];
  const auto n = static_cast<int64_t>(mine.size());
  auto index = [&](const char* what, const std::function<std::vector<int64_t>()>& build) {
    return cached_plan_index(plan, rank, what, counted.device(), build);
  };
  // Local column of each fragment's first token (sent) and last token (receives a halo).
  const at::Tensor first_columns = index("the loss halo's first columns", [&] {
    std::vector<int64_t> columns;
    int64_t offset = 0;
    for (const Fragment& f : mine) {
      columns.push_back(offset);
      offset += f.size();
    }
    return columns;
  });
  const at::Tensor last_columns = index("the loss halo's last columns", [&] {
    std::vector<int64_t> columns;
    int64_t offset = 0;
    for (const Fragment& f : mine) columns.push_back((offset += f.size()) - 1);
    return columns;
  });
  // Row of `received` holding the label at each fragment's global end: fragment k of rank q
  // sits at q * F + k; row cp * F (all -100) for the end of the sequence.
  const at::Tensor halo_rows = index("the loss halo's rows", [&] {
    std::unordered_map<int64_t, int64_t> row_of_start;
    for (int q = 0; q < cp; ++q) {
      const auto& list = plan.fragments[static_cast<std::size_t>(q)];
      for (std::size_t k = 0; k < list.size(); ++k)
        row_of_start[list[k].begin] = q * F + static_cast<int64_t>(k);
    }
    std::vector<int64_t> rows;
    for (const Fragment& f : mine) {
      const auto found = row_of_start.find(f.end);
      rows.push_back(found == row_of_start.end() ? cp * F : found->second);
    }
    return rows;
  });
  at::Tensor send = at::full({F, B}, kIgnoreLabel, counted.options());
  send.narrow(0, 0, n).copy_(counted.index_select(1, first_columns).t());
  at::Tensor received = at::full({cp * F + 1, B}, kIgnoreLabel, counted.options());
  mesh->all_gather(send.data_ptr(), received.data_ptr(), static_cast<std::size_t>(F * B),
                   ScalarKind::kInt64);
  at::Tensor targets = at::empty({B, L}, counted.options());
  targets.narrow(1, 0, L - 1).copy_(counted.narrow(1, 1, L - 1));
  const at::Tensor halo = fault("boundary_label_dropped")
                              ? at::full({B, n}, kIgnoreLabel, counted.options())
                              : received.index_select(0, halo_rows).t();
  targets.index_copy_(1, last_columns, halo);
  return targets;
}
// This rank's share of N, before any exchange: every position p > 0 of a global row is
// predicted by position p - 1, so N counts the counted labels of every position but the row's
// first (at local column `first_column`, -1 when another rank holds it).
at::Tensor local_target_count(const at::Tensor& counted, int64_t first_column) {
  const at::Tensor counts = counted != kIgnoreLabel;
  at::Tensor count = counts.sum().to(at::kLong);
  if (first_column >= 0) count = count - counts.select(1, first_column).sum();
  return count.reshape({1});
}

// The local column of global position 0 (-1: another rank's).
int64_t first_column(const LayoutPlan* plan, int rank) {
  if (plan == nullptr) return rank == 0 ? 0 : -1;
  int64_t offset = 0;
  for (const Fragment& f : plan->fragments[static_cast<std::size_t>(rank)]) {
    if (f.begin == 0) return offset;
    offset += f.size();
  }
  return -1;
}

// N summed over the mesh, as a one-element int64 tensor on the targets' device (never read
// on the host: the kernel forms CP / N itself). The same all-gather carries what the ranks
// must agree on (B, L, the vocabulary, the dtype), so the check costs no extra exchange and
// runs before the halo, whose sizes it guards.
at::Tensor global_target_count(const at::Tensor& local_count, const at::Tensor& source,
                               const char* source_name, int64_t vocab, const char* vocab_name,
                               const MeshPtr& mesh, const LayoutPlan* plan) {
  if (cp_size(mesh) == 1) return local_count;
  const int64_t B = source.size(0), L = source.size(1), layout = plan_fingerprint(plan);
  const std::vector<Agreed> fields{
      {source_name, "the batch size B", B},
      {source_name, "the local length L", L},
      {vocab_name, "the vocabulary size V", vocab},
      {source_name, "the dtype", dtype_code(source), dtype_name},
      {"layout", "the layout plan", layout, plan_description},
  };
  const bool read =
      agreement_needs_reading(source, mesh, {-1, B, L, vocab, dtype_code(source), layout});
  const at::Tensor table = exchange_agreed(local_count, fields, *mesh, read,
                                           "every CP rank must compute the loss of the same batch");
  at::Tensor count =
      fault("count_local_only") ? local_count : table.select(1, 0).sum().reshape({1});
  if (fault("count_times_cp")) count = count * cp_size(mesh);
  return count;
}

}  // namespace

Targets prepare_targets(const at::Tensor& labels, const at::Tensor& valid, const at::Tensor& source,
                        const char* source_name, int64_t vocab, const char* vocab_name,
                        const MeshPtr& mesh, const LayoutPlan* plan) {
  check_targets_inputs(labels, valid, source, source_name, vocab);
  check_plan_tie(valid, "valid", plan);
  check_plan_tie(labels, "labels", plan);
  if (plan != nullptr && plan->cp_size != cp_size(mesh))
    raise("layout", "was planned for CP = ", plan->cp_size, " but the mesh has ", cp_size(mesh),
          " ranks");
  if (plan != nullptr && labels.size(1) != plan->local_len)
    raise("labels", "have ", labels.size(1), " tokens per row but the layout gives each rank ",
          plan->local_len);
  const int64_t B = labels.size(0), L = labels.size(1);
  const at::Tensor counted =
      at::where(valid.reshape({B, L}), labels, at::full_like(labels, kIgnoreLabel));
  const at::Tensor count =
      global_target_count(local_target_count(counted, first_column(plan, cp_rank(mesh))), source,
                          source_name, vocab, vocab_name, mesh, plan);
  // Rank r owning [r L, (r + 1) L) alone: the next token of its last is rank r + 1's first.
  bool rank_ordered = true;
  for (int r = 0; plan != nullptr && r < plan->cp_size; ++r) {
    const auto& list = plan->fragments[static_cast<std::size_t>(r)];
    rank_ordered = rank_ordered && list.size() == 1 && list[0].begin == r * plan->local_len;
  }
  at::Tensor targets =
      rank_ordered ? shifted_targets(counted, mesh) : shifted_targets(counted, mesh, *plan);
  return {targets, count};
}

}  // namespace cpkit::detail
