// The vocab-major CPU kernels' blocking (cpu/vocab_major.hpp), in a header of its own so tests
// can place vocabularies on its edges without compiling the kernels.
#pragma once

#include <cstdint>

namespace cpkit::kernels {

// Vocabulary entries a task reduces or writes, and a statistics block's share of them
// (kVocabBlock rows of n floats stay in L1 / L2 between the block's max and its sums).
constexpr std::int64_t kVocabSlice = 2048;
constexpr std::int64_t kVocabBlock = 16;

}  // namespace cpkit::kernels
