// Every random input of a case derives from the case's seed through input_seed: the harness
// and the rank processes call it with the same (input, index) and so build the same tensors,
// with no seed offsets copied between files.
#pragma once

#include <cstdint>

namespace cpkit::harness {

enum class Input : std::uint64_t {
  kIds = 1,      // token ids and labels of a batch
  kEmbeds,       // inputs_embeds rows (index: batch row)
  kLogits,       // global logits (index: microbatch)
  kGatherValue,  // gather_tokens input (index: rank)
  kGatherGrad,   // gather_tokens upstream gradient (index: rank)
  kQuery,        // attention Q, K, V and output gradient
  kKey,
  kValue,
  kAttentionGrad,
  kLayout,       // memory layouts of non-contiguous inputs and gradients
  kHidden,       // the LM head's input hidden states (index: microbatch)
  kHeadWeight,   // the LM head's weight [V, H]
  kLogprobGrad,  // token_logprobs' upstream gradients (index: microbatch)
  kPolicy,       // policy_loss' advantages and old / ref / sampler log-probs (index: microbatch)
};

// splitmix64 of (seed, input, index): distinct streams for distinct inputs.
constexpr std::uint64_t input_seed(std::uint64_t seed, Input input, std::int64_t index = 0) {
  std::uint64_t z = seed ^ (static_cast<std::uint64_t>(input) * 0x9E3779B97F4A7C15ull) ^
                    (static_cast<std::uint64_t>(index) * 0xD1B54A32D192ED03ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace cpkit::harness
