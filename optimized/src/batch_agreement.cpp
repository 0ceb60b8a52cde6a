// The CP group shards one global batch: shapes and options always, values by checksum under
// the value checks (docs/spec.md section 3). A data loader seeded per rank is the classic
// way to break this, and without the check every rank trains on its own garbage.
#include <ATen/ATen.h>

#include "agreement.hpp"
#include "sharder_internal.hpp"
#include "tensor_checks.hpp"

namespace cpkit::detail {

namespace {

std::int64_t size_or(const at::Tensor& t, int64_t dim) {
  return t.defined() && t.dim() > dim ? t.size(dim) : -1;
}

std::string layout_of_code(std::int64_t code) { return layout_name(static_cast<LayoutKind>(code)); }

std::string present(std::int64_t code) { return code != 0 ? "given" : "absent"; }

}  // namespace

void check_batch_agrees(const CPBatch& batch, const MeshPtr& mesh, int num_chunks,
                        const PadOptions& pad) {
  if (cp_size(mesh) == 1) return;
  std::vector<Agreed> fields{
      {"qkv_format", "the format (0 bshd, 1 thd)", batch.qkv_format == "thd" ? 1 : 0},
      {"num_chunks", "num_chunks", num_chunks},
      {"pad_multiple", "pad_multiple", pad.pad_multiple},
      {"pad_token_id", "pad_token_id", pad.pad_token_id},
      {"layout", "the layout", static_cast<std::int64_t>(pad.layout), layout_of_code},
      {"labels", "the batch size B", size_or(batch.labels, 0)},
      {"labels", "the sequence length S", size_or(batch.labels, 1)},
      {"input_ids", "input_ids", batch.input_ids.defined() ? 1 : 0, present},
      {"inputs_embeds", "the hidden size H", size_or(batch.inputs_embeds, 2)},
      {"position_ids", "position_ids", batch.position_ids.defined() ? 1 : 0, present},
      {"attention_mask", "attention_mask", batch.attention_mask.defined() ? 1 : 0, present},
      {"seq_lens", "the number of document columns D", size_or(batch.seq_lens, 1)},
      {"images", "the number of images", static_cast<std::int64_t>(batch.images.size())},
  };
  std::vector<std::int64_t> key{-2};
  for (const Agreed& f : fields) key.push_back(f.value);
  const bool read = agreement_needs_reading(batch.labels, mesh, key);
  // Under the value checks, the values too: a checksum per integer stream (0 when absent or
  // unchecked, so every rank's table has the same width).
  const bool values = check_values_of(batch.labels);
  const std::pair<const char*, const at::Tensor*> streams[] = {
      {"input_ids", &batch.input_ids},       {"labels", &batch.labels},
      {"position_ids", &batch.position_ids}, {"attention_mask", &batch.attention_mask},
      {"seq_lens", &batch.seq_lens},         {"seq_lens_padded", &batch.seq_lens_padded}};
  std::vector<at::Tensor> sums;
  for (const auto& [name, t] : streams)
    sums.push_back(values && t->defined() ? value_checksum(*t)
                                          : at::zeros({}, batch.labels.options()));
  const at::Tensor carried = at::stack(sums);
  const at::Tensor table =
      exchange_agreed(carried, fields, *mesh, read,
                      "every CP rank must shard the same global batch with the same options");
  if (!values) return;
  const at::Tensor host = table.narrow(1, 0, carried.numel()).cpu();
  const int me = mesh->rank();
  for (int64_t i = 0; i < carried.numel(); ++i)
    for (int r = 0; r < mesh->size(); ++r)
      if (host[r][i].item<int64_t>() != host[me][i].item<int64_t>())
        raise(streams[i].first, "holds different values on rank ", me, " and rank ", r,
              " (checksums ", host[me][i].item<int64_t>(), " and ", host[r][i].item<int64_t>(),
              "): every CP rank must shard the same global batch (a data loader seeded per rank "
              "gives each rank its own)");
}

}  // namespace cpkit::detail
