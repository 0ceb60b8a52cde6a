// The root of torch.ops.cpkit.*: the library's definition, with its one process-wide op.
// Each op family registers its schemas and CPU and CUDA kernels in its own file (gather_ops,
// loss_ops, shard_ops, attention_ops, policy_ops, packer_ops), calling the optimized library
// (the code the property harness proves). The process group travels as its name (a str), as
// PyTorch's functional collectives pass it, so torch.compile traces the ops without a graph
// break. Autograd and fake (meta) kernels are registered from Python (cpkit/_ops.py);
// nothing here computes anything of its own.
#include <torch/library.h>

#include <string>

#include "cpkit/optimized/validation.hpp"
#include "op_support.hpp"

namespace cpkit::python {

namespace {

// The value-check switch by name: "cpu_only" (the default), "always" or "never".
void set_value_checks_op(const std::string& mode) {
  checked([&] {
    if (mode == "cpu_only")
      set_value_checks(ValueChecks::kCpuOnly);
    else if (mode == "always")
      set_value_checks(ValueChecks::kAlways);
    else if (mode == "never")
      set_value_checks(ValueChecks::kNever);
    else
      raise("mode", "must be \"cpu_only\", \"always\" or \"never\", got \"", mode, "\"");
  });
}

}  // namespace

TORCH_LIBRARY(cpkit, m) {
  // Process-wide: not a tensor op, called outside any traced region.
  m.def("set_value_checks(str mode) -> ()", &set_value_checks_op);
}

}  // namespace cpkit::python
