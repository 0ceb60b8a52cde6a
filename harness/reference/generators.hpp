// Random cases for the reference properties. A case is a handful of shrinkable parameters
// plus a seed that fills the tensors, so RapidCheck shrinks to small, readable cases and
// `RC_PARAMS="reproduce=..."` replays a failure exactly.
#pragma once

#include <rapidcheck.h>

#include <ostream>

#include "cpkit/reference/reference.hpp"

namespace cpkit::reference::harness {

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
  bool use_positions = false;  // explicit position_ids with a random offset
  bool shard_primary = true;
  std::int64_t pad_token_id = 0;
  int ignore_percent = 0;  // share of labels set to -100; 100 = all ignored
  float logit_scale = 1;   // up to 1e4 to stress the softmax
  std::uint64_t seed = 0;
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
};

rc::Gen<BshdCase> gen_bshd_case();
rc::Gen<PackedCase> gen_packed_case();

BshdBatch make_batch(const BshdCase& c);
PackedBatch make_batch(const PackedCase& c);
ShardOptions options_of(const BshdCase& c);
ShardOptions options_of(const PackedCase& c);

// Random [rows, cols] floats, N(0, scale^2), from `seed`.
FloatMatrix random_floats(Eigen::Index rows, Eigen::Index cols, float scale, std::uint64_t seed);

void showValue(const BshdCase& c, std::ostream& os);
void showValue(const PackedCase& c, std::ostream& os);

// |a - b| <= atol + rtol * |b| everywhere (and equal shapes); else a description.
std::string mismatch(const FloatMatrix& actual, const FloatMatrix& expected, double atol,
                     double rtol);

}  // namespace cpkit::reference::harness
