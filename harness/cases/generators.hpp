// Random cases for the properties of both implementations. A case is a handful of shrinkable
// parameters plus a seed that fills the tensors (inputs.hpp), so RapidCheck shrinks to small,
// readable cases and `RC_PARAMS="reproduce=..."` replays a failure exactly.
#pragma once

#include <rapidcheck.h>

#include <ostream>

#include "cpkit/reference/reference.hpp"
#include "inputs.hpp"

namespace cpkit::harness {

using reference::BshdBatch;
using reference::FloatMatrix;
using reference::PackedBatch;
using reference::ShardOptions;

struct BshdCase {
  int cp = 1;
  int num_chunks = 1;
  int rows_per_chunk = 1;
  int seq_len = 1;
  int pad_multiple = 1;
  int hidden = 1;
  int vocab = 2;
  bool use_embeds = false;
  bool use_mask = false;       // attention_mask with random zeros
  bool use_positions = false;  // explicit position_ids: offset, restarts and gaps
  // Attention cases (varlen offsets): mask zeros only as left and right padding, positions
  // only increasing (gaps kept, no restart).
  bool edge_mask_only = false;
  bool increasing_positions = false;
  bool shard_primary = true;
  std::int64_t pad_token_id = 0;
  int ignore_percent = 0;  // share of labels set to -100; 100 = all ignored
  float logit_scale = 1;   // up to 1e4 to stress the softmax
  std::uint64_t seed = 0;
  std::string layout = "contiguous";  // SPEC 2b
};

struct Doc {
  int length = 0;  // real tokens
  int extra = 0;   // slot padding after them
};

struct PackedCase {
  int cp = 1;
  int pad_multiple = 1;
  int hidden = 1;
  int vocab = 2;
  bool use_embeds = false;
  bool shard_primary = true;
  std::int64_t pad_token_id = 0;
  std::vector<std::vector<Doc>> rows;  // one document list per microbatch
  int tail = 0;                        // row-tail tokens past the longest row
  int sentinels = 0;                   // extra -1000 entries past the longest list
  int ignore_percent = 0;
  float logit_scale = 1;
  std::uint64_t seed = 0;
  std::string layout = "contiguous";  // SPEC 2b
};

// Vocabulary sizes weighted to the edges of every blocking in the kernels (the CPU kernel's
// 512-logit blocks, 8 AVX2 lanes, CUDA's float4) and +-1 around them.
rc::Gen<int> gen_vocab();
// Production vocabularies (GPT-2, Llama 2, Llama 3, Qwen 2): 50257, 32000, 128256, 151936,
// and the powers of two 32768 and 131072.
rc::Gen<int> gen_production_vocab();

rc::Gen<BshdCase> gen_bshd_case();
// BSHD cases whose mask varlen offsets can express: left/right padding, increasing positions.
rc::Gen<BshdCase> gen_attention_bshd_case();
rc::Gen<PackedCase> gen_packed_case();
// A layout other than "contiguous" that applies to the case's format.
rc::Gen<std::string> gen_bshd_layout();
rc::Gen<std::string> gen_packed_layout();

BshdBatch make_batch(const BshdCase& c);
PackedBatch make_batch(const PackedCase& c);
ShardOptions options_of(const BshdCase& c);
ShardOptions options_of(const PackedCase& c);

// Random [rows, cols] floats, N(0, scale^2), from `seed`.
FloatMatrix random_floats(Eigen::Index rows, Eigen::Index cols, float scale, std::uint64_t seed);

// Every rank's inputs to a per-token loss of microbatch m: its columns of a global
// [rows * S_pad, X] matrix (logits or hidden states), and its labels and valid mask.
struct RankLossInputs {
  std::vector<FloatMatrix> values;
  std::vector<reference::IntMatrix> labels;
  std::vector<reference::BoolVector> valid;
};
RankLossInputs cut_for_ranks(const FloatMatrix& global, const reference::Sharder& s, int m);

void showValue(const BshdCase& c, std::ostream& os);
void showValue(const PackedCase& c, std::ostream& os);

// The closeness rule of compare/closeness.hpp on Eigen matrices: empty when shapes are equal
// and every element is close; else what differs first.
std::string mismatch(const FloatMatrix& actual, const FloatMatrix& expected, double atol,
                     double rtol);

}  // namespace cpkit::harness
