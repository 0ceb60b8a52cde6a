#include "convert.hpp"

namespace cpkit::harness {

at::Tensor to_tensor(const reference::IntMatrix& m) {
  return at::from_blob(const_cast<std::int64_t*>(m.data()), {m.rows(), m.cols()}, at::kLong)
      .clone();
}

at::Tensor to_tensor(const reference::BoolMatrix& m) {
  return at::from_blob(const_cast<bool*>(m.data()), {m.rows(), m.cols()}, at::kBool).clone();
}

at::Tensor to_tensor(const reference::FloatMatrix& m) {
  return at::from_blob(const_cast<float*>(m.data()), {m.rows(), m.cols()}, at::kFloat).clone();
}

at::Tensor to_tensor(const reference::BoolVector& v) {
  return at::from_blob(const_cast<bool*>(v.data()), {v.size()}, at::kBool).clone();
}

at::Tensor to_tensor(const reference::IntVector& v) {
  return at::from_blob(const_cast<std::int64_t*>(v.data()), {v.size()}, at::kLong).clone();
}

at::Tensor to_tensor(const reference::FloatRows& rows) {
  std::vector<at::Tensor> parts;
  for (const auto& r : rows) parts.push_back(to_tensor(r));
  return at::stack(parts);
}

CPBatch to_cp_batch(const reference::BshdBatch& b) {
  CPBatch out;
  if (b.input_ids) out.input_ids = to_tensor(*b.input_ids);
  if (b.inputs_embeds) out.inputs_embeds = to_tensor(*b.inputs_embeds);
  out.labels = to_tensor(b.labels);
  if (b.position_ids) out.position_ids = to_tensor(*b.position_ids);
  if (b.attention_mask) out.attention_mask = to_tensor(*b.attention_mask);
  for (const auto& image : b.images)
    out.images.push_back(
        at::from_blob(const_cast<float*>(image.values.data()), image.shape, at::kFloat).clone());
  return out;
}

CPBatch to_cp_batch(const reference::PackedBatch& b) {
  CPBatch out;
  out.qkv_format = "thd";
  if (b.input_ids) out.input_ids = to_tensor(*b.input_ids);
  if (b.inputs_embeds) out.inputs_embeds = to_tensor(*b.inputs_embeds);
  out.labels = to_tensor(b.labels);
  out.seq_lens = to_tensor(b.seq_lens);
  out.seq_lens_padded = to_tensor(b.seq_lens_padded);
  return out;
}

PadOptions pad_of(const reference::ShardOptions& o) {
  return {o.pad_multiple, o.pad_token_id, layout_kind(o.layout), o.balance_slack};
}

at::Tensor layout_positions_of(const Layout& layout) {
  return at::tensor(layout_positions(*layout.plan, layout.rank), at::kLong);
}

reference::LayoutPositions reference_layout(const reference::Sharder& s, int m) {
  if (s.options().layout == "contiguous") return {};
  return s.global(m).owned;
}

}  // namespace cpkit::harness
