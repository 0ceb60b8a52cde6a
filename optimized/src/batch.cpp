// CPBatch::from_map and the checks every preparation shares.
#include "cpkit/optimized/batch.hpp"

#include "cpkit/optimized/constants.hpp"
#include "cpkit/optimized/error.hpp"
#include "sharder_internal.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

CPBatch CPBatch::from_map(const std::unordered_map<std::string, c10::IValue>& values) {
  CPBatch batch;
  const std::unordered_map<std::string, at::Tensor CPBatch::*> tensors = {
      {"input_ids", &CPBatch::input_ids},
      {"inputs_embeds", &CPBatch::inputs_embeds},
      {"labels", &CPBatch::labels},
      {"position_ids", &CPBatch::position_ids},
      {"attention_mask", &CPBatch::attention_mask},
      {"seq_lens", &CPBatch::seq_lens},
      {"seq_lens_padded", &CPBatch::seq_lens_padded}};
  for (const auto& [name, value] : values) {
    if (auto it = tensors.find(name); it != tensors.end()) {
      if (value.isNone()) continue;
      if (!value.isTensor()) raise(name, "must be a tensor, got ", value.tagKind());
      batch.*(it->second) = value.toTensor();
    } else if (name == "images") {
      if (!value.isTensorList()) raise(name, "must be a list of tensors, got ", value.tagKind());
      batch.images = value.toTensorVector();
    } else if (name == "qkv_format") {
      if (!value.isString()) raise(name, "must be a string, got ", value.tagKind());
      batch.qkv_format = value.toStringRef();
    } else {
      raise(name,
            "is not a CPBatch field (input_ids, inputs_embeds, labels, position_ids, "
            "attention_mask, seq_lens, seq_lens_padded, images, qkv_format)");
    }
  }
  return batch;
}

namespace detail {

void check_common(const CPBatch& batch, int cp_size, int num_chunks, const PadOptions& pad) {
  if (cp_size < 1) raise("mesh", "CP size must be >= 1, got ", cp_size);
  if (num_chunks < 1) raise("num_chunks", "must be >= 1, got ", num_chunks);
  if (pad.pad_multiple < 1) raise("pad_multiple", "must be >= 1, got ", pad.pad_multiple);
  if (batch.input_ids.defined() == batch.inputs_embeds.defined())
    raise("input_ids", "exactly one of input_ids and inputs_embeds must be given, got ",
          batch.input_ids.defined() ? "both" : "neither");
  require_defined(batch.labels, "labels");
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
