// CPBatch::from_map and the checks every preparation shares.
#include "cpkit/optimized/batch.hpp"

#include "cpkit/optimized/constants.hpp"
#include "cpkit/optimized/error.hpp"
#include "sharder_internal.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

const std::unordered_map<std::string, at::Tensor CPBatch::*>& tensor_fields() {
  static const std::unordered_map<std::string, at::Tensor CPBatch::*> fields = {
      {"input_ids", &CPBatch::input_ids},
      {"inputs_embeds", &CPBatch::inputs_embeds},
      {"labels", &CPBatch::labels},
      {"position_ids", &CPBatch::position_ids},
      {"attention_mask", &CPBatch::attention_mask},
      {"seq_lens", &CPBatch::seq_lens},
      {"seq_lens_padded", &CPBatch::seq_lens_padded}};
  return fields;
}

BatchValue kind_of(const c10::IValue& value) {
  if (value.isNone()) return BatchValue::kNone;
  if (value.isTensor()) return BatchValue::kTensor;
  if (value.isTensorList()) return BatchValue::kTensorList;
  if (value.isString()) return BatchValue::kString;
  return BatchValue::kOther;
}

}  // namespace

void check_batch_field(const std::string& name, BatchValue kind, const std::string& got) {
  const BatchValue wanted = tensor_fields().count(name) ? BatchValue::kTensor
                            : name == "images"          ? BatchValue::kTensorList
                            : name == "qkv_format"      ? BatchValue::kString
                                                        : BatchValue::kNone;
  if (wanted == BatchValue::kNone)
    raise(name,
          "is not a CPBatch field (input_ids, inputs_embeds, labels, position_ids, "
          "attention_mask, seq_lens, seq_lens_padded, images, qkv_format)");
  if (kind == BatchValue::kNone || kind == wanted) return;
  raise(name, "must be ",
        wanted == BatchValue::kTensor       ? "a tensor"
        : wanted == BatchValue::kTensorList ? "a list of tensors"
                                            : "a string",
        ", got ", got);
}

CPBatch CPBatch::from_map(const std::unordered_map<std::string, c10::IValue>& values) {
  CPBatch batch;
  for (const auto& [name, value] : values) {
    check_batch_field(name, kind_of(value), value.tagKind());
    if (value.isNone()) continue;
    if (auto it = tensor_fields().find(name); it != tensor_fields().end())
      batch.*(it->second) = value.toTensor();
    else if (name == "images")
      batch.images = value.toTensorVector();
    else
      batch.qkv_format = value.toStringRef();
  }
  return batch;
}

namespace detail {

void check_common(const CPBatch& batch, int cp_size, int num_chunks, const PadOptions& pad) {
  if (cp_size < 1) raise("mesh", "CP size must be >= 1, got ", cp_size);
  if (num_chunks < 1) raise("num_chunks", "must be >= 1, got ", num_chunks);
  if (pad.pad_multiple < 1) raise("pad_multiple", "must be >= 1, got ", pad.pad_multiple);
  check_balance_slack(pad.balance_slack);
  if (batch.input_ids.defined() == batch.inputs_embeds.defined())
    raise("input_ids", "exactly one of input_ids and inputs_embeds must be given, got ",
          batch.input_ids.defined() ? "both" : "neither");
  if (!batch.labels.defined()) raise("labels", "is missing");
  require_dim(batch.labels, 2, "labels");
  require_dtype(batch.labels, at::kLong, "labels");
  const auto B = batch.labels.size(0), S = batch.labels.size(1);
  if (B == 0 || S == 0) raise("labels", "empty batch: shape ", shape_of(batch.labels));
  if (batch.input_ids.defined()) {
    require_dtype(batch.input_ids, at::kLong, "input_ids");
    if (batch.input_ids.sizes() != batch.labels.sizes())
      raise("input_ids", "has shape ", shape_of(batch.input_ids), " but labels have ",
            shape_of(batch.labels));
  } else {
    require_dim(batch.inputs_embeds, 3, "inputs_embeds");
    if (!at::isFloatingType(batch.inputs_embeds.scalar_type()))
      raise("inputs_embeds", "must be floating point, got ", batch.inputs_embeds.scalar_type());
    if (batch.inputs_embeds.size(0) != B || batch.inputs_embeds.size(1) != S ||
        batch.inputs_embeds.size(2) < 1)
      raise("inputs_embeds", "has shape ", shape_of(batch.inputs_embeds), " but [", B, ", ", S,
            ", H >= 1] is required");
  }
  const at::Tensor negative = (batch.labels < 0) & (batch.labels != kIgnoreLabel);
  if (check_values_of(batch.labels) && negative.any().item<bool>()) {
    const auto i = negative.flatten().nonzero()[0][0].item<int64_t>();
    raise("labels", "value ", batch.labels.flatten()[i].item<int64_t>(), " at [", i / S, ", ",
          i % S, "] is negative and not the ignore label ", kIgnoreLabel);
  }
  for (std::size_t i = 0; i < batch.images.size(); ++i) {
    const at::Tensor& image = batch.images[i];
    require_defined(image, "images");
    if (image.dim() != 3)
      raise("images", "image ", i, " has ", image.dim(), " dimensions (shape ", shape_of(image),
            "), expected [C, H, W]");
    if (image.numel() == 0) raise("images", "image ", i, " is empty: ", shape_of(image));
  }
}

}  // namespace detail
}  // namespace cpkit
