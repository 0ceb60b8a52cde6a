// The optimized path reproduces every golden case: shards bit for bit (all ranks from one
// process), losses and gradients from real rank processes within FP32 tolerance.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <sstream>

#include "closeness.hpp"
#include "test_each.hpp"

#include "cpkit/optimized/cp_attention.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/policy_loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "golden_case.hpp"
#include "rank_processes.hpp"

namespace cpkit::golden {
namespace {

at::Tensor ints(const Json& rows) {
  const auto v = rows.get<std::vector<std::vector<std::int64_t>>>();
  std::vector<std::int64_t> flat;
  for (const auto& r : v) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(v.size()), -1});
}

template <class V>
void expect_rows(const at::Tensor& actual, const V& expected, const std::string& what) {
  const at::Tensor a = actual.to(at::kLong);
  ASSERT_EQ(a.size(0), static_cast<int64_t>(expected.size())) << what;
  for (std::size_t b = 0; b < expected.size(); ++b)
    for (std::size_t t = 0; t < expected[b].size(); ++t)
      EXPECT_EQ(a[b][t].item<int64_t>(), static_cast<int64_t>(expected[b][t]))
          << what << " [" << b << ", " << t << "]";
}

CPBatch batch_of(const GoldenCase& c) {
  CPBatch b;
  b.qkv_format = c.format;
  b.input_ids = ints(c.inputs.at("input_ids"));
  b.labels = ints(c.inputs.at("labels"));
  for (const char* key : {"position_ids", "attention_mask", "seq_lens", "seq_lens_padded"}) {
    if (!c.inputs.contains(key)) continue;
    const at::Tensor t = ints(c.inputs.at(key));
    if (std::string(key) == "position_ids") b.position_ids = t;
    if (std::string(key) == "attention_mask") b.attention_mask = t;
    if (std::string(key) == "seq_lens") b.seq_lens = t;
    if (std::string(key) == "seq_lens_padded") b.seq_lens_padded = t;
  }
  return b;
}

Sharder prepare(const GoldenCase& c, const MeshPtr& mesh) {
  const PadOptions pad{c.pad_multiple, c.pad_token_id, layout_kind(c.layout)};
  if (mesh) {
    return c.format == "thd" ? prepare_packed_cp_inputs(batch_of(c), mesh, c.num_chunks, true, pad)
                             : prepare_cp_inputs(batch_of(c), mesh, c.num_chunks, true, pad);
  }
  return c.format == "thd"
             ? prepare_packed_cp_inputs_for(batch_of(c), c.cp, c.num_chunks, true, pad)
             : prepare_cp_inputs_for(batch_of(c), c.cp, c.num_chunks, true, pad);
}

// A test whose body runs once per golden case (test_each.hpp), reading it as `case_name`.
#define CPKIT_TEST_FOR_EACH_CASE(suite, name, names) \
  CPKIT_TEST_FOR_EACH(suite, name, std::string, case_name, "case ", names)

CPKIT_TEST_FOR_EACH_CASE(OptimizedGolden, ShardsMatchTheOracle, golden_case_names()) {
  const GoldenCase c = load_golden_case(case_name);
  const Sharder s = prepare(c, nullptr);
  for (int m = 0; m < s.num_microbatches(); ++m)
    for (const ExpectedRank& e : c.microbatches[m].ranks) {
      const std::string at = "microbatch " + std::to_string(m) + " rank " + std::to_string(e.rank);
      const LocalShard l = s.local(m, e.rank);
      EXPECT_EQ(layout_positions(*l.layout.plan, e.rank), e.positions) << at;
      expect_rows(l.input_ids, e.input_ids, "input_ids " + at);
      expect_rows(l.labels, e.labels, "labels " + at);
      expect_rows(l.position_ids, e.position_ids, "positions " + at);
      expect_rows(l.document_ids, e.document_ids, "documents " + at);
      expect_rows(l.padding, e.padding, "padding " + at);
      expect_rows(l.valid.view(l.labels.sizes()), e.valid, "valid " + at);
    }
}

CPKIT_TEST_FOR_EACH_CASE(OptimizedGolden, LossMatchesTheOracleOnRealRanks, golden_case_names()) {
  const GoldenCase c = load_golden_case(case_name);
  const auto outcomes = ranks::run_ranks_collect(c.cp, [&c](int rank, const MeshPtr& mesh) {
    const Sharder s = prepare(c, mesh);
    std::ostringstream out;
    out.precision(9);
    for (int m = 0; m < s.num_microbatches(); ++m) {
      const LocalShard l = s.local(m);
      const auto& mb = c.microbatches[m];
      const ExpectedRank& e = mb.ranks[rank];
      std::vector<float> flat;  // the oracle's logits at the oracle's positions of this rank
      for (const auto& row : mb.logits)
        for (const std::int64_t j : e.positions)
          flat.insert(flat.end(), row[j].begin(), row[j].end());
      const at::Tensor logits = at::tensor(flat)
                                    .view({l.labels.size(0), l.layout.local_len, c.vocab})
                                    .requires_grad_(true);
      const at::Tensor loss = shifted_cp_loss(logits, l.labels, l.valid, mesh,
                                              {.softcap = c.softcap, .layout = l.layout.plan});
      loss.backward();
      if (!harness::is_close(loss.item<double>(), e.loss, kGoldenLossRtol, kGoldenLossRtol))
        out << "microbatch " << m << ": loss " << loss.item<double>() << " vs " << e.loss << "\n";
      const at::Tensor grad = logits.grad();
      for (std::size_t b = 0; b < e.grad.size(); ++b)
        for (std::size_t j = 0; j < e.grad[b].size(); ++j)
          for (int v = 0; v < c.vocab; ++v)
            if (!harness::is_close(grad[b][j][v].item<double>(), e.grad[b][j][v], kGoldenGradAtol,
                                   0)) {
              out << "microbatch " << m << ": grad [" << b << ", " << j << ", " << v << "] "
                  << grad[b][j][v].item<double>() << " vs " << e.grad[b][j][v] << "\n";
              return out.str();
            }
    }
    return out.str();
  });
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
    EXPECT_EQ(o.output, "") << "rank " << o.rank << ":\n" << o.output;
  }
}

// golden/offsets: hand-checkable varlen attention offsets (docs/spec.md section 4a).
CPKIT_TEST_FOR_EACH_CASE(OptimizedOffsetsGolden, ReproducesTheHandCheckedOffsets,
                         golden_case_names(CPKIT_GOLDEN_OFFSETS_DIR)) {
  const OffsetsCase o = load_offsets_case(case_name);
  GoldenCase c;
  c.name = o.name;
  c.format = o.format;
  c.cp = o.cp;
  c.inputs = o.inputs;
  const Sharder s = prepare(c, nullptr);
  auto values = [](const at::Tensor& t) {
    const at::Tensor longs = t.to(at::kLong).contiguous();
    return std::vector<std::int64_t>(longs.data_ptr<int64_t>(),
                                     longs.data_ptr<int64_t>() + longs.numel());
  };
  for (const OffsetsRank& e : o.ranks) {
    const auto got = attention_offsets(s, 0, e.rank);
    EXPECT_EQ(values(got.cu_seqlens_q), e.cu_seqlens_q) << "rank " << e.rank;
    EXPECT_EQ(values(got.cu_seqlens_k), e.cu_seqlens_k) << "rank " << e.rank;
    EXPECT_EQ(got.max_seqlen_q, e.max_seqlen_q) << "rank " << e.rank;
    EXPECT_EQ(got.max_seqlen_k, e.max_seqlen_k) << "rank " << e.rank;
    EXPECT_EQ(got.k_begin, e.k_begin) << "rank " << e.rank;
    EXPECT_EQ(got.k_end, e.k_end) << "rank " << e.rank;
  }
}

}  // namespace
}  // namespace cpkit::golden

namespace cpkit::golden {
namespace {

at::Tensor floats(const Floats2& rows) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat).view({static_cast<int64_t>(rows.size()), -1});
}

// What differs first between `got` and the oracle's `expected` (same element count), or "".
std::string first_difference(const at::Tensor& got, const at::Tensor& expected,
                             const std::string& what) {
  const at::Tensor a = got.to(at::kDouble).contiguous().flatten();
  const at::Tensor e = expected.to(at::kDouble).contiguous().flatten();
  if (a.numel() != e.numel())
    return what + ": " + std::to_string(a.numel()) + " elements vs " + std::to_string(e.numel()) +
           "\n";
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!harness::is_close(a[i].item<double>(), e[i].item<double>(), kGoldenGradAtol,
                           kGoldenLossRtol))
      return what + " element " + std::to_string(i) + ": " + std::to_string(a[i].item<double>()) +
             " vs " + std::to_string(e[i].item<double>()) + "\n";
  return "";
}

// golden/linear on real ranks, with chunks of 1, 3 and the default number of rows.
CPKIT_TEST_FOR_EACH_CASE(OptimizedLinearGolden, MatchesTheOracleOnRealRanks,
                         golden_case_names(CPKIT_GOLDEN_LINEAR_DIR)) {
  const LinearCase c = load_linear_case(case_name);
  const auto outcomes = ranks::run_ranks_collect(c.batch.cp, [&c](int rank, const MeshPtr& mesh) {
    const Sharder s = prepare(c.batch, mesh);
    const at::Tensor weight = floats(c.weight);
    std::string out;
    for (int m = 0; m < s.num_microbatches(); ++m) {
      const LocalShard l = s.local(m);
      const LinearMicrobatch& mb = c.microbatches[m];
      Floats2 mine;
      for (const auto& row : mb.hidden)
        for (const std::int64_t j : layout_positions(*l.layout.plan, rank)) mine.push_back(row[j]);
      const LinearRank& e = mb.ranks[rank];
      for (const int64_t chunk : {0, 1, 3}) {
        const at::Tensor hidden =
            floats(mine).view({l.labels.size(0), l.layout.local_len, -1}).requires_grad_(true);
        const at::Tensor w = weight.clone().requires_grad_(true);
        LinearLossOptions options;
        options.softcap = c.batch.softcap;
        options.chunk_rows = chunk;
        const at::Tensor loss = shifted_cp_linear_loss(hidden, w, l.labels, l.valid, mesh, options);
        loss.backward();
        const std::string at =
            "microbatch " + std::to_string(m) + " chunk " + std::to_string(chunk);
        if (!harness::is_close(loss.item<double>(), e.loss, kGoldenLossRtol, kGoldenLossRtol))
          out += at + ": loss " + std::to_string(loss.item<double>()) + " vs " +
                 std::to_string(e.loss) + "\n";
        Floats2 dhidden;
        for (const auto& row : e.dhidden) dhidden.insert(dhidden.end(), row.begin(), row.end());
        out += first_difference(hidden.grad(), floats(dhidden), at + " d hidden");
        out += first_difference(w.grad(), floats(e.dweight), at + " d weight");
      }
    }
    return out;
  });
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
    EXPECT_EQ(o.output, "") << "rank " << o.rank << ":\n" << o.output;
  }
}

// golden/logprobs on real ranks, with chunks of 1, 3 and the default number of rows.
CPKIT_TEST_FOR_EACH_CASE(OptimizedLogprobsGolden, MatchesTheOracleOnRealRanks,
                         golden_case_names(CPKIT_GOLDEN_LOGPROBS_DIR)) {
  const LogprobsCase c = load_logprobs_case(case_name);
  const auto outcomes = ranks::run_ranks_collect(c.batch.cp, [&c](int rank, const MeshPtr& mesh) {
    const Sharder s = prepare(c.batch, mesh);
    const at::Tensor weight = floats(c.weight);
    std::string out;
    for (int m = 0; m < s.num_microbatches(); ++m) {
      const LocalShard l = s.local(m);
      const LogprobsMicrobatch& mb = c.microbatches[m];
      Floats2 mine, up(2);
      for (std::size_t b = 0; b < mb.hidden.size(); ++b)
        for (const std::int64_t j : layout_positions(*l.layout.plan, rank)) {
          mine.push_back(mb.hidden[b][j]);
          for (int u = 0; u < 2; ++u) up[u].push_back(mb.upstream[u][b][j]);
        }
      const int64_t rows = l.labels.size(0), L = l.layout.local_len;
      const LogprobsRank& e = mb.ranks[rank];
      Floats2 dhidden;
      for (const auto& row : e.dhidden) dhidden.insert(dhidden.end(), row.begin(), row.end());
      for (const int64_t chunk : {0, 1, 3}) {
        const at::Tensor hidden = floats(mine).view({rows, L, -1}).requires_grad_(true);
        const at::Tensor w = weight.clone().requires_grad_(true);
        TokenLogprobsOptions options;
        options.softcap = c.batch.softcap;
        options.temperature = c.temperature;
        options.entropy = true;
        options.chunk_rows = chunk;
        const TokenLogprobs r = token_logprobs(hidden, w, l.labels, l.valid, mesh, options);
        const at::Tensor u = floats(up).view({2, rows, L});
        ((r.logprobs * u[0]).sum() + (r.entropy * u[1]).sum()).backward();
        const std::string at =
            "microbatch " + std::to_string(m) + " chunk " + std::to_string(chunk);
        out += first_difference(r.logprobs, floats(e.logprobs), at + " logprobs");
        out += first_difference(r.entropy, floats(e.entropy), at + " entropy");
        Floats2 has;
        for (const auto& row : e.has_target) has.emplace_back(row.begin(), row.end());
        out += first_difference(r.has_target.to(at::kFloat), floats(has), at + " has_target");
        out +=
            first_difference(hidden.grad(), floats(dhidden).view({rows, L, -1}), at + " d hidden");
        out += first_difference(w.grad(), floats(e.dweight), at + " d weight");
      }
    }
    return out;
  });
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
    EXPECT_EQ(o.output, "") << "rank " << o.rank << ":\n" << o.output;
  }
}

// [rows][tokens][width] at `positions` of every row, as [rows * positions, width].
Floats2 at_positions(const Floats3& x, const std::vector<std::int64_t>& positions) {
  Floats2 out;
  for (const auto& row : x)
    for (const std::int64_t j : positions) out.push_back(row[static_cast<std::size_t>(j)]);
  return out;
}

Floats2 flattened(const Floats3& x) {
  Floats2 out;
  for (const auto& row : x) out.insert(out.end(), row.begin(), row.end());
  return out;
}

CPKIT_TEST_FOR_EACH_CASE(OptimizedAttentionGolden, MatchesTheOracleOnRealRanks,
                         golden_case_names(CPKIT_GOLDEN_ATTENTION_DIR)) {
  const AttentionCase c = load_attention_case(case_name);
  const auto outcomes = ranks::run_ranks_collect(c.batch.cp, [&c](int rank, const MeshPtr& mesh) {
    const Sharder s = prepare(c.batch, mesh);
    const LocalShard l = s.local(0);
    const std::vector<std::int64_t> positions = layout_positions(*l.layout.plan, rank);
    const AttentionRank& e = c.ranks[static_cast<std::size_t>(rank)];
    if (positions != e.positions)
      return std::string("the shard's positions are not the oracle's\n");
    const int64_t rows = l.labels.size(0), L = l.layout.local_len;
    auto local = [&](const Floats3& x, int64_t heads) {
      return floats(at_positions(x, positions)).view({rows, L, heads, c.head_dim});
    };
    const at::Tensor q = local(c.q, c.hq).requires_grad_(true);
    const at::Tensor k = local(c.k, c.hkv).requires_grad_(true);
    const at::Tensor v = local(c.v, c.hkv).requires_grad_(true);
    CpAttentionOptions options{c.scale, c.batch.softcap, at::Tensor()};
    if (!c.sinks.empty()) options.sinks = at::tensor(c.sinks).requires_grad_(true);
    const auto plan = std::make_shared<const AttentionPlan>(attention_plan(s, 0, rank, c.window));
    const CpAttentionOutput r = cp_attention(q, k, v, plan, mesh, options);
    (r.out * local(c.upstream, c.hq)).sum().backward();
    std::string out = first_difference(r.out, floats(flattened(e.out)), "out");
    out += first_difference(r.lse.transpose(1, 2), floats(flattened(e.lse)), "lse");
    out += first_difference(q.grad(), floats(flattened(e.dq)), "dq");
    out += first_difference(k.grad(), floats(flattened(e.dk)), "dk");
    out += first_difference(v.grad(), floats(flattened(e.dv)), "dv");
    if (!c.sinks.empty())
      out += first_difference(options.sinks.grad(), at::tensor(e.dsinks), "d sinks");
    return out;
  });
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
    EXPECT_EQ(o.output, "") << "rank " << o.rank << ":\n" << o.output;
  }
}

CPKIT_TEST_FOR_EACH_CASE(OptimizedPolicyGolden, MatchesTheOracleOnRealRanks,
                         golden_case_names(CPKIT_GOLDEN_POLICY_DIR)) {
  const PolicyCase c = load_policy_case(case_name);
  const auto outcomes = ranks::run_ranks_collect(c.batch.cp, [&c](int rank, const MeshPtr& mesh) {
    const Sharder s = prepare(c.batch, mesh);
    const LocalShard l = s.local(0);
    const std::vector<std::int64_t> positions = layout_positions(*l.layout.plan, rank);
    const PolicyRank& e = c.ranks[static_cast<std::size_t>(rank)];
    if (positions != e.positions)
      return std::string("the shard's positions are not the oracle's\n");
    const int64_t rows = l.labels.size(0), L = l.layout.local_len;
    const at::Tensor hidden =
        floats(at_positions(c.hidden, positions)).view({rows, L, -1}).requires_grad_(true);
    const at::Tensor weight = floats(c.weight).requires_grad_(true);
    std::vector<at::Tensor> x;
    for (const Floats2& input : c.per_position) {
      Floats2 mine;
      for (const auto& row : input)
        for (const std::int64_t j : positions) mine.push_back({row[static_cast<std::size_t>(j)]});
      x.push_back(floats(mine).view({rows, L}));
    }
    const Json& p = c.policy;
    PolicyLossOptions o;
    o.kind = parse_policy_kind(p.at("kind"));
    o.eps_low = p.at("eps_low");
    o.eps_high = p.at("eps_high");
    o.dual_clip = p.at("dual_clip");
    o.kl = parse_kl_estimator(p.at("kl"));
    o.kl_coef = p.at("kl_coef");
    o.tis_cap = p.at("tis_cap");
    o.entropy_coef = p.at("entropy_coef");
    o.aggregation = parse_policy_aggregation(p.at("aggregation"));
    o.divisor = p.at("divisor");
    o.layout = l.layout.plan;
    const PolicyLoss r = policy_loss(hidden, weight, l.labels, l.valid, mesh,
                                     {x[0], x[1], x[2], x[3], l.document_ids}, o);
    r.loss.backward();
    std::string out;
    if (!harness::is_close(r.loss.item<double>(), e.loss, kGoldenGradAtol, kGoldenLossRtol))
      out +=
          "loss " + std::to_string(r.loss.item<double>()) + " vs " + std::to_string(e.loss) + "\n";
    out += first_difference(r.logprobs, floats(e.logprobs), "logprobs");
    out += first_difference(r.ratio, floats(e.ratio), "ratio");
    out += first_difference(hidden.grad(), floats(flattened(e.dhidden)).view({rows, L, -1}),
                            "d hidden");
    out += first_difference(weight.grad(), floats(e.dweight), "d weight");
    return out;
  });
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.message;
    EXPECT_EQ(o.output, "") << "rank " << o.rank << ":\n" << o.output;
  }
}

}  // namespace
}  // namespace cpkit::golden
