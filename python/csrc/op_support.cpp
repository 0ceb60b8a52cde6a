// The native module's shared helpers (op_support.hpp).
#include "op_support.hpp"

namespace cpkit::python {

CPBatch batch_of(const std::optional<at::Tensor>& input_ids,
                 const std::optional<at::Tensor>& inputs_embeds, const at::Tensor& labels,
                 const std::optional<at::Tensor>& position_ids,
                 const std::optional<at::Tensor>& attention_mask,
                 const std::optional<at::Tensor>& seq_lens,
                 const std::optional<at::Tensor>& seq_lens_padded, const std::string& qkv_format,
                 const std::vector<at::Tensor>& images) {
  CPBatch batch;
  batch.images = images;
  batch.qkv_format = qkv_format;
  batch.input_ids = input_ids.value_or(at::Tensor());
  batch.inputs_embeds = inputs_embeds.value_or(at::Tensor());
  batch.labels = labels;
  batch.position_ids = position_ids.value_or(at::Tensor());
  batch.attention_mask = attention_mask.value_or(at::Tensor());
  batch.seq_lens = seq_lens.value_or(at::Tensor());
  batch.seq_lens_padded = seq_lens_padded.value_or(at::Tensor());
  return batch;
}

double balance_slack_of(std::optional<double> balance_slack) {
  return balance_slack.value_or(kDefaultBalanceSlack);
}

PadOptions pad_options(int64_t pad_multiple, int64_t pad_token_id, const std::string& layout,
                       std::optional<double> balance_slack) {
  return {static_cast<int>(pad_multiple), pad_token_id, layout_kind(layout),
          balance_slack_of(balance_slack)};
}

Sharder sharder_for(const CPBatch& batch, int64_t cp_size, int64_t rank, int64_t num_chunks,
                    int64_t pad_multiple, const std::string& layout,
                    std::optional<double> balance_slack) {
  const PadOptions pad = pad_options(pad_multiple, 0, layout, balance_slack);
  Sharder sharder = batch.qkv_format == "thd"
                        ? prepare_packed_cp_inputs_for(batch, static_cast<int>(cp_size),
                                                       static_cast<int>(num_chunks), false, pad)
                        : prepare_cp_inputs_for(batch, static_cast<int>(cp_size),
                                                static_cast<int>(num_chunks), false, pad);
  if (rank < 0 || rank >= cp_size) raise("rank", "must be in [0, ", cp_size, "), got ", rank);
  return sharder;
}

}  // namespace cpkit::python
