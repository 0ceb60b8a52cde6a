// What every shifted loss does before its kernel (internal header): check labels and valid,
// shift them with the next rank's first column (the boundary halo), count the targets over
// the mesh. One exchange of each per call, however the logits are then computed.
#pragma once

#include <ATen/core/Tensor.h>

#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/layout.hpp"

namespace cpkit::detail {

struct Targets {
  at::Tensor targets;  // [B, L] int64, contiguous: the label position j predicts, or -100
  at::Tensor count;    // [1] int64 on the same device: N, summed over the mesh
};

// `source` is the tensor the logits come from (named `source_name` in errors): labels
// [B, L] int64 and valid [B * L] bool must match its [B, L] and device; labels must lie in
// [0, vocab) or be -100, and no valid token may carry -100.
// `plan` (null: contiguous) says where each local fragment's next token lives. The ranks'
// B, L, vocabulary (`vocab`, named `vocab_name`) and source dtype must agree (agreement.hpp).
Targets prepare_targets(const at::Tensor& labels, const at::Tensor& valid, const at::Tensor& source,
                        const char* source_name, int64_t vocab, const char* vocab_name,
                        const MeshPtr& mesh, const LayoutPlan* plan);

}  // namespace cpkit::detail
