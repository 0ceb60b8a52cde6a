// The batch a trainer hands to cpkit, fillable from a name -> value map.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "cpkit/optimized/layout.hpp"

#include <string>
#include <unordered_map>
#include <vector>

namespace cpkit {

struct CPBatch {
  // Exactly one of input_ids [B, S] int64 / inputs_embeds [B, S, H] floating.
  at::Tensor input_ids;
  at::Tensor inputs_embeds;
  at::Tensor labels;                // [B, S] int64, unshifted, -100 = ignore
  at::Tensor position_ids;          // optional [B, S] int64 (BSHD)
  at::Tensor attention_mask;        // optional [B, S], 1 keep, 0 padding (BSHD)
  at::Tensor seq_lens;              // THD: [num_chunks, D] int64, ragged rows end in -1000
  at::Tensor seq_lens_padded;       // THD: [num_chunks, D] int64 slot lengths
  std::vector<at::Tensor> images;   // complete [C, H, W] images, never sharded
  std::string qkv_format = "bshd";  // "bshd" or "thd"

  // Keys: input_ids, inputs_embeds, labels, position_ids, attention_mask, seq_lens,
  // seq_lens_padded (tensors), images (a tensor list), qkv_format (a string). Unknown keys
  // and values of the wrong kind raise cpkit::Error.
  static CPBatch from_map(const std::unordered_map<std::string, c10::IValue>& values);
};

// The kind of a value given for a CPBatch field.
enum class BatchValue { kNone, kTensor, kTensorList, kString, kOther };

// Raises unless `name` is a CPBatch field that takes a value of `kind` (None: any field);
// `got` describes the value for the message. from_map's check, and the Python package's for
// a batch dict, so both name a bad field in the same words.
void check_batch_field(const std::string& name, BatchValue kind, const std::string& got);

// How sequences are padded before the cut and which rank owns which tokens (docs/spec.md
// sections 2 and 2b).
struct PadOptions {
  int pad_multiple = 1;           // S_pad is a multiple of CP * pad_multiple (2 CP for head_tail)
  std::int64_t pad_token_id = 0;  // written into padded id positions
  LayoutKind layout = LayoutKind::kContiguous;
  double balance_slack = kDefaultBalanceSlack;  // balanced: cost max / mean allowed above 1
};

}  // namespace cpkit
