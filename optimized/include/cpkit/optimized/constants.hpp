// The values cpkit's inputs use as markers, in one place. Plain C++ (no LibTorch), so the
// kernels, CPU and CUDA, see the same constants as the API.
#pragma once

#include <cstdint>

namespace cpkit {

// The label value that marks a token the loss ignores (HF / PyTorch convention).
inline constexpr std::int64_t kIgnoreLabel = -100;
// Ends a ragged document list in seq_lens / seq_lens_padded.
inline constexpr std::int64_t kSeqLenSentinel = -1000;

}  // namespace cpkit
