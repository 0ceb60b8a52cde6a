// A frozen case of golden/cases/*.json: inputs and the oracle's expected per-rank outputs.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace cpkit::golden {

using Json = nlohmann::json;

struct ExpectedRank {
  int rank = 0;
  // The global position of each local token: the file's "positions" (layouts other than
  // contiguous) or [begin, end).
  std::vector<std::int64_t> positions;
  // [rows][L] streams
  std::vector<std::vector<std::int64_t>> input_ids, labels, position_ids, document_ids;
  std::vector<std::vector<bool>> padding, valid;
  double loss = 0;
  std::vector<std::vector<std::vector<float>>> grad;  // [rows][L][V]
};

struct ExpectedMicrobatch {
  std::vector<int> rows;
  std::int64_t padded_len = 0;
  double single_device_loss = 0;
  std::int64_t targets = 0;
  std::vector<std::vector<std::vector<float>>> logits;  // [rows][S_pad][V]
  std::vector<ExpectedRank> ranks;
};

struct GoldenCase {
  std::string name, format;
  int cp = 1, num_chunks = 1, pad_multiple = 1, vocab = 2;
  std::int64_t pad_token_id = 0;
  double softcap = 0;                 // > 0: the loss caps the logits first
  std::string layout = "contiguous";  // docs/spec.md section 2b
  Json inputs;  // input_ids, labels, optional position_ids / attention_mask / seq_lens...
  std::vector<ExpectedMicrobatch> microbatches;
};

// Every case file under `dir` (golden/cases by default), sorted by name.
std::vector<std::string> golden_case_names(const std::string& dir = CPKIT_GOLDEN_DIR);
GoldenCase load_golden_case(const std::string& name);

// golden/offsets: varlen attention offsets of every rank for a small, hand-checkable row.
struct OffsetsRank {
  int rank = 0;
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0, k_begin = 0, k_end = 0;
};
struct OffsetsCase {
  std::string name, format;
  int cp = 1;
  Json inputs;
  std::vector<OffsetsRank> ranks;
};
OffsetsCase load_offsets_case(const std::string& name);

// golden/linear: the LM head fused into the loss. `batch` carries the layout fields and
// inputs (its microbatches stay empty); each rank's expected values are autograd of its own
// loss term on the unsharded batch.
using Floats2 = std::vector<std::vector<float>>;
using Floats3 = std::vector<Floats2>;
struct LinearRank {
  int rank = 0;
  double loss = 0;
  Floats3 dhidden;  // [rows][L][H]
  Floats2 dweight;  // [V][H]
};
struct LinearMicrobatch {
  std::vector<int> rows;
  Floats3 hidden;  // [rows][S_pad][H]
  std::vector<LinearRank> ranks;
};
struct LinearCase {
  GoldenCase batch;
  int hidden_size = 1;
  Floats2 weight;  // [V][H]
  std::vector<LinearMicrobatch> microbatches;
};
LinearCase load_linear_case(const std::string& name);

// golden/logprobs: token_logprobs. Each rank's expected values are fp64 log_softmax and
// entropy of its positions; its gradients autograd of sum(u_lp * lp + u_ent * H) over them.
struct LogprobsRank {
  int rank = 0;
  Floats2 logprobs, entropy;                  // [rows][L]
  std::vector<std::vector<bool>> has_target;  // [rows][L]
  Floats3 dhidden;                            // [rows][L][H]
  Floats2 dweight;                            // [V][H]
};
struct LogprobsMicrobatch {
  std::vector<int> rows;
  Floats3 hidden;    // [rows][S_pad][H]
  Floats3 upstream;  // [2][rows][S_pad]: d/d logprob, d/d entropy
  std::vector<LogprobsRank> ranks;
};
struct LogprobsCase {
  GoldenCase batch;
  double temperature = 1;
  Floats2 weight;  // [V][H]
  std::vector<LogprobsMicrobatch> microbatches;
};
LogprobsCase load_logprobs_case(const std::string& name);

// golden/attention: cp_attention over one microbatch. Heads are flattened: q, out, dq and
// the upstream are [rows][tokens][Hq * D], k, v, dk, dv [rows][tokens][Hkv * D]; a rank's
// values are those of its positions, in local order.
struct AttentionRank {
  int rank = 0;
  std::vector<std::int64_t> positions;
  Floats3 out, dq, dk, dv;
  Floats3 lse;                // [rows][L][Hq]; -inf where a query sees nothing (null in JSON)
  std::vector<float> dsinks;  // this rank's term; empty without sinks
};
struct AttentionCase {
  GoldenCase batch;  // batch.softcap is the attention's soft cap
  std::int64_t window = 0, hq = 1, hkv = 1, head_dim = 1;
  double scale = 0;
  Floats3 q, k, v, upstream;  // [rows][S_pad][heads * D]
  std::vector<float> sinks;   // [Hq] or empty
  std::vector<AttentionRank> ranks;
};
AttentionCase load_attention_case(const std::string& name);

// golden/policy: policy_loss over one microbatch. per_position [4][rows][S_pad]: advantages,
// old, reference and sampler log-probabilities; a rank's values are those of its positions.
struct PolicyRank {
  int rank = 0;
  std::vector<std::int64_t> positions;
  double loss = 0;
  Floats2 logprobs, ratio;  // [rows][L]
  Floats3 dhidden;          // [rows][L][H]
  Floats2 dweight;          // [V][H]
};
struct PolicyCase {
  GoldenCase batch;
  Json policy;     // kind, eps_low, eps_high, dual_clip, kl, kl_coef, tis_cap, entropy_coef, ...
  Floats3 hidden;  // [rows][S_pad][H]
  Floats2 weight;  // [V][H]
  Floats3 per_position;  // [4][rows][S_pad]
  std::vector<PolicyRank> ranks;
};
PolicyCase load_policy_case(const std::string& name);

// FP32 oracle vs cpkit: losses and gradients within these.
inline constexpr double kGoldenLossRtol = 1e-5;
inline constexpr double kGoldenGradAtol = 1e-6;

}  // namespace cpkit::golden
