// What every op file of the native module shares (internal header): errors as Python's
// ValueError, and a batch rebuilt from an op's optional tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <vector>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"

namespace cpkit::python {

// cpkit::Error becomes Python's ValueError (c10::ValueError), message unchanged; cpkit's
// Python layer raises it as cpkit.CPError.
template <class F>
auto checked(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// An op's output never aliases its input (its schema promises a fresh tensor): at CP = 1
// or for a cut that is already contiguous the library returns a view, copied here.
inline at::Tensor fresh(const at::Tensor& out, const at::Tensor& input) {
  return input.defined() && out.is_alias_of(input) ? out.clone() : out;
}

CPBatch batch_of(const std::optional<at::Tensor>& input_ids,
                 const std::optional<at::Tensor>& inputs_embeds, const at::Tensor& labels,
                 const std::optional<at::Tensor>& position_ids,
                 const std::optional<at::Tensor>& attention_mask,
                 const std::optional<at::Tensor>& seq_lens,
                 const std::optional<at::Tensor>& seq_lens_padded, const std::string& qkv_format,
                 const std::vector<at::Tensor>& images = {});

// The batch sharded for `cp_size` ranks without communication (attention offsets and plans:
// computed per rank on demand, so no collective may run here).
// balance_slack: none for the library's default (kDefaultBalanceSlack).
double balance_slack_of(std::optional<double> balance_slack);
PadOptions pad_options(int64_t pad_multiple, int64_t pad_token_id, const std::string& layout,
                       std::optional<double> balance_slack);
Sharder sharder_for(const CPBatch& batch, int64_t cp_size, int64_t rank, int64_t num_chunks,
                    int64_t pad_multiple, const std::string& layout,
                    std::optional<double> balance_slack);

}  // namespace cpkit::python
