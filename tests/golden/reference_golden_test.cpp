// The reference reproduces every golden case: shards bit for bit, losses and gradients
// within FP32 tolerance of the PyTorch oracle.
#include <gtest/gtest.h>

#include <set>

#include "closeness.hpp"
#include "cpkit/reference/reference.hpp"
#include "golden_case.hpp"

namespace cpkit::golden {
namespace {

namespace ref = cpkit::reference;

ref::IntMatrix ints(const Json& rows) {
  const auto v = rows.get<std::vector<std::vector<std::int64_t>>>();
  ref::IntMatrix m(static_cast<Eigen::Index>(v.size()), static_cast<Eigen::Index>(v[0].size()));
  for (std::size_t b = 0; b < v.size(); ++b)
    for (std::size_t t = 0; t < v[b].size(); ++t) m(b, t) = v[b][t];
  return m;
}

template <class M, class V>
void expect_rows(const M& actual, const V& expected, const std::string& what) {
  ASSERT_EQ(actual.rows(), static_cast<Eigen::Index>(expected.size())) << what;
  for (std::size_t b = 0; b < expected.size(); ++b) {
    ASSERT_EQ(actual.cols(), static_cast<Eigen::Index>(expected[b].size())) << what;
    for (std::size_t t = 0; t < expected[b].size(); ++t)
      EXPECT_EQ(actual(b, t), expected[b][t]) << what << " [" << b << ", " << t << "]";
  }
}

ref::Sharder prepare(const GoldenCase& c) {
  const ref::ShardOptions options{c.cp,           c.num_chunks, c.pad_multiple,
                                  c.pad_token_id, true,         c.layout};
  if (c.format == "thd") {
    ref::PackedBatch b;
    b.input_ids = ints(c.inputs.at("input_ids"));
    b.labels = ints(c.inputs.at("labels"));
    b.seq_lens = ints(c.inputs.at("seq_lens"));
    b.seq_lens_padded = ints(c.inputs.at("seq_lens_padded"));
    return ref::prepare_packed_cp_inputs(b, options);
  }
  ref::BshdBatch b;
  b.input_ids = ints(c.inputs.at("input_ids"));
  b.labels = ints(c.inputs.at("labels"));
  if (c.inputs.contains("position_ids")) b.position_ids = ints(c.inputs.at("position_ids"));
  if (c.inputs.contains("attention_mask")) b.attention_mask = ints(c.inputs.at("attention_mask"));
  return ref::prepare_cp_inputs(b, options);
}

class ReferenceGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceGolden, ReproducesTheOracle) {
  const GoldenCase c = load_golden_case(GetParam());
  const ref::Sharder s = prepare(c);
  ASSERT_EQ(s.num_microbatches(), static_cast<int>(c.microbatches.size()));
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const ExpectedMicrobatch& mb = c.microbatches[m];
    std::vector<ref::FloatMatrix> logits;
    std::vector<ref::IntMatrix> labels;
    std::vector<ref::BoolVector> valid;
    for (const ExpectedRank& e : mb.ranks) {
      const std::string at = "microbatch " + std::to_string(m) + " rank " + std::to_string(e.rank);
      const ref::LocalShard l = s.local(m, e.rank);
      EXPECT_EQ(l.layout.positions, e.positions) << at;
      expect_rows(*l.input_ids, e.input_ids, "input_ids " + at);
      expect_rows(l.labels, e.labels, "labels " + at);
      expect_rows(l.position_ids, e.position_ids, "positions " + at);
      expect_rows(l.document_ids, e.document_ids, "documents " + at);
      expect_rows(l.padding, e.padding, "padding " + at);
      expect_rows(
          ref::BoolMatrix(l.valid.reshaped<Eigen::RowMajor>(l.labels.rows(), l.labels.cols())),
          e.valid, "valid " + at);
      const auto rows = static_cast<Eigen::Index>(mb.rows.size());
      ref::FloatMatrix mine(rows * l.layout.local_len, c.vocab);
      for (Eigen::Index b = 0; b < rows; ++b)
        for (Eigen::Index j = 0; j < l.layout.local_len; ++j)
          for (int v = 0; v < c.vocab; ++v)
            mine(b * l.layout.local_len + j, v) =
                mb.logits[b][e.positions[static_cast<std::size_t>(j)]][v];
      logits.push_back(mine);
      labels.push_back(l.labels);
      valid.push_back(l.valid);
    }
    const ref::LayoutPositions owned =
        c.layout == "contiguous" ? ref::LayoutPositions{} : s.global(m).owned;
    const auto losses = ref::shifted_cp_loss(logits, labels, valid, {c.softcap, owned});
    double mean = 0;
    for (const ExpectedRank& e : mb.ranks) {
      const auto& got = losses[e.rank];
      mean += got.value / c.cp;
      EXPECT_NEAR(got.value, e.loss, kGoldenLossRtol * (1 + std::abs(e.loss))) << "rank " << e.rank;
      for (std::size_t b = 0; b < e.grad.size(); ++b)
        for (std::size_t j = 0; j < e.grad[b].size(); ++j)
          for (int v = 0; v < c.vocab; ++v)
            ASSERT_NEAR(got.grad_logits(b * e.grad[b].size() + j, v), e.grad[b][j][v],
                        kGoldenGradAtol)
                << "rank " << e.rank << " row " << b << " position " << j << " class " << v;
    }
    EXPECT_NEAR(mean, mb.single_device_loss, kGoldenLossRtol * (1 + mb.single_device_loss));
    EXPECT_EQ(losses[0].global_targets, mb.targets);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceGolden, ::testing::ValuesIn(golden_case_names()));

TEST(GoldenCases, AtLeastTwelveCoverBothFormatsCpOneToEightAndEveryLayout) {
  const auto names = golden_case_names();
  ASSERT_GE(names.size(), 12u);
  bool bshd = false, thd = false, cp1 = false, cp8 = false;
  std::set<std::string> layouts;
  for (const auto& n : names) {
    const GoldenCase c = load_golden_case(n);
    bshd |= c.format == "bshd";
    thd |= c.format == "thd";
    cp1 |= c.cp == 1;
    cp8 |= c.cp == 8;
    layouts.insert(c.format + " " + c.layout);
  }
  EXPECT_TRUE(bshd && thd && cp1 && cp8);
  for (const char* kind : {"bshd head_tail", "thd head_tail", "thd balanced"})
    EXPECT_TRUE(layouts.count(kind)) << kind;
}

// golden/offsets: hand-checkable varlen attention offsets (docs/spec.md section 4a).
class ReferenceOffsetsGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceOffsetsGolden, ReproducesTheHandCheckedOffsets) {
  const OffsetsCase o = load_offsets_case(GetParam());
  GoldenCase c;
  c.name = o.name;
  c.format = o.format;
  c.cp = o.cp;
  c.inputs = o.inputs;
  const ref::Sharder s = prepare(c);
  auto values = [](const ref::IntVector& v) {
    return std::vector<std::int64_t>(v.data(), v.data() + v.size());
  };
  for (const OffsetsRank& e : o.ranks) {
    const auto got = ref::attention_offsets(s, 0, e.rank);
    EXPECT_EQ(values(got.cu_seqlens_q), e.cu_seqlens_q) << "rank " << e.rank;
    EXPECT_EQ(values(got.cu_seqlens_k), e.cu_seqlens_k) << "rank " << e.rank;
    EXPECT_EQ(got.max_seqlen_q, e.max_seqlen_q) << "rank " << e.rank;
    EXPECT_EQ(got.max_seqlen_k, e.max_seqlen_k) << "rank " << e.rank;
    EXPECT_EQ(got.k_begin, e.k_begin) << "rank " << e.rank;
    EXPECT_EQ(got.k_end, e.k_end) << "rank " << e.rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Offsets, ReferenceOffsetsGolden,
                         ::testing::ValuesIn(golden_case_names(CPKIT_GOLDEN_OFFSETS_DIR)));

}  // namespace
}  // namespace cpkit::golden

namespace cpkit::golden {
namespace {

// golden/linear: the reference's head + loss against autograd of each rank's loss term.
class ReferenceLinearGolden : public ::testing::TestWithParam<std::string> {};

ref::FloatMatrix matrix(const Floats2& rows) {
  ref::FloatMatrix m(static_cast<Eigen::Index>(rows.size()),
                     static_cast<Eigen::Index>(rows[0].size()));
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t k = 0; k < rows[i].size(); ++k) m(i, k) = rows[i][k];
  return m;
}

// Same shape and every element within kGoldenGradAtol + kGoldenLossRtol * |expected|.
bool close(const ref::FloatMatrix& got, const ref::FloatMatrix& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return false;
  for (Eigen::Index i = 0; i < got.size(); ++i)
    if (!harness::is_close(got.data()[i], expected.data()[i], kGoldenGradAtol, kGoldenLossRtol))
      return false;
  return true;
}

TEST_P(ReferenceLinearGolden, ReproducesTheOracle) {
  const LinearCase c = load_linear_case(GetParam());
  const ref::Sharder s = prepare(c.batch);
  const ref::FloatMatrix weight = matrix(c.weight);
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const LinearMicrobatch& mb = c.microbatches[m];
    std::vector<ref::FloatMatrix> hidden;
    std::vector<ref::IntMatrix> labels;
    std::vector<ref::BoolVector> valid;
    for (const LinearRank& e : mb.ranks) {
      const ref::LocalShard l = s.local(m, e.rank);
      Floats2 mine;
      for (const auto& row : mb.hidden)
        for (const std::int64_t j : l.layout.positions) mine.push_back(row[j]);
      hidden.push_back(matrix(mine));
      labels.push_back(l.labels);
      valid.push_back(l.valid);
    }
    const auto losses =
        ref::shifted_cp_linear_loss(hidden, weight, labels, valid, {c.batch.softcap});
    for (const LinearRank& e : mb.ranks) {
      const auto& got = losses[e.rank];
      const std::string at = "microbatch " + std::to_string(m) + " rank " + std::to_string(e.rank);
      EXPECT_NEAR(got.value, e.loss, kGoldenLossRtol * (1 + std::abs(e.loss))) << at;
      Floats2 dhidden;
      for (const auto& row : e.dhidden) dhidden.insert(dhidden.end(), row.begin(), row.end());
      EXPECT_TRUE(close(got.grad_hidden, matrix(dhidden))) << "d hidden " << at;
      EXPECT_TRUE(close(got.grad_weight, matrix(e.dweight))) << "d weight " << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Linear, ReferenceLinearGolden,
                         ::testing::ValuesIn(golden_case_names(CPKIT_GOLDEN_LINEAR_DIR)));

// golden/logprobs: the reference's per-token values and gradients against fp64 autograd.
class ReferenceLogprobsGolden : public ::testing::TestWithParam<std::string> {};

// Row-major [rows][L] values as one vector.
template <class T>
std::vector<double> flat(const std::vector<std::vector<T>>& rows) {
  std::vector<double> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

TEST_P(ReferenceLogprobsGolden, ReproducesTheOracle) {
  const LogprobsCase c = load_logprobs_case(GetParam());
  const ref::Sharder s = prepare(c.batch);
  const ref::FloatMatrix weight = matrix(c.weight);
  for (int m = 0; m < s.num_microbatches(); ++m) {
    const LogprobsMicrobatch& mb = c.microbatches[m];
    std::vector<ref::FloatMatrix> hidden;
    std::vector<ref::IntMatrix> labels;
    std::vector<ref::BoolVector> valid;
    std::vector<std::vector<double>> g_lp, g_ent;
    for (const LogprobsRank& e : mb.ranks) {
      const ref::LocalShard l = s.local(m, e.rank);
      Floats2 mine;
      g_lp.emplace_back();
      g_ent.emplace_back();
      for (std::size_t b = 0; b < mb.hidden.size(); ++b)
        for (const std::int64_t j : l.layout.positions) {
          mine.push_back(mb.hidden[b][j]);
          g_lp.back().push_back(mb.upstream[0][b][j]);
          g_ent.back().push_back(mb.upstream[1][b][j]);
        }
      hidden.push_back(matrix(mine));
      labels.push_back(l.labels);
      valid.push_back(l.valid);
    }
    const auto got = ref::token_logprobs(hidden, weight, labels, valid, g_lp, g_ent,
                                         {c.batch.softcap, c.temperature, {}});
    for (const LogprobsRank& e : mb.ranks) {
      const auto& r = got[e.rank];
      const std::string at = "microbatch " + std::to_string(m) + " rank " + std::to_string(e.rank);
      const std::vector<double> lp = flat(e.logprobs), ent = flat(e.entropy),
                                has = flat(e.has_target);
      ASSERT_EQ(r.logprobs.size(), lp.size()) << at;
      for (std::size_t i = 0; i < lp.size(); ++i) {
        EXPECT_EQ(r.has_target[i], has[i] != 0) << at << " position " << i;
        EXPECT_NEAR(r.logprobs[i], lp[i], kGoldenLossRtol * (1 + std::abs(lp[i]))) << at;
        EXPECT_NEAR(r.entropy[i], ent[i], kGoldenLossRtol * (1 + std::abs(ent[i]))) << at;
      }
      Floats2 dhidden;
      for (const auto& row : e.dhidden) dhidden.insert(dhidden.end(), row.begin(), row.end());
      EXPECT_TRUE(close(r.grad_hidden, matrix(dhidden))) << "d hidden " << at;
      EXPECT_TRUE(close(r.grad_weight, matrix(e.dweight))) << "d weight " << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Logprobs, ReferenceLogprobsGolden,
                         ::testing::ValuesIn(golden_case_names(CPKIT_GOLDEN_LOGPROBS_DIR)));

// golden/attention: the reference's per-rank attention (one row at a time) and gradients
// against fp64 autograd of dense masked attention over the unsharded rows.
class ReferenceAttentionGolden : public ::testing::TestWithParam<std::string> {};

// Head h of [tokens][heads * D] values at `positions` as an [L, D] matrix.
ref::FloatMatrix head_at(const Floats2& row, const std::vector<std::int64_t>& positions,
                         std::int64_t h, std::int64_t d) {
  ref::FloatMatrix m(static_cast<Eigen::Index>(positions.size()), d);
  for (std::size_t j = 0; j < positions.size(); ++j)
    for (std::int64_t c = 0; c < d; ++c)
      m(static_cast<Eigen::Index>(j), c) =
          row[static_cast<std::size_t>(positions[j])][static_cast<std::size_t>(h * d + c)];
  return m;
}

std::vector<std::int64_t> local_order(std::size_t n) {
  std::vector<std::int64_t> out(n);
  for (std::size_t j = 0; j < n; ++j) out[j] = static_cast<std::int64_t>(j);
  return out;
}

TEST_P(ReferenceAttentionGolden, ReproducesTheOracle) {
  const AttentionCase c = load_attention_case(GetParam());
  const ref::Sharder s = prepare(c.batch);
  const ref::AttentionOptions options{c.scale, c.window, c.batch.softcap,
                                      std::vector<double>(c.sinks.begin(), c.sinks.end())};
  std::vector<std::vector<double>> dsinks(c.ranks.size(), std::vector<double>(c.sinks.size()));
  for (std::size_t b = 0; b < c.q.size(); ++b) {
    std::vector<ref::RankHeads> ranks;
    std::vector<std::vector<ref::FloatMatrix>> d_out;
    for (const AttentionRank& e : c.ranks) {
      const ref::LocalShard l = s.local(0, e.rank);
      ASSERT_EQ(l.layout.positions, e.positions) << "rank " << e.rank;
      const auto row = static_cast<Eigen::Index>(b);
      ref::RankHeads r{{},
                       {},
                       {},
                       {l.position_ids.row(row).transpose(), l.document_ids.row(row).transpose(),
                        l.padding.row(row).transpose()}};
      d_out.emplace_back();
      for (std::int64_t h = 0; h < c.hq; ++h) {
        r.q.push_back(head_at(c.q[b], e.positions, h, c.head_dim));
        d_out.back().push_back(head_at(c.upstream[b], e.positions, h, c.head_dim));
      }
      for (std::int64_t g = 0; g < c.hkv; ++g) {
        r.k.push_back(head_at(c.k[b], e.positions, g, c.head_dim));
        r.v.push_back(head_at(c.v[b], e.positions, g, c.head_dim));
      }
      ranks.push_back(r);
    }
    const auto outputs = ref::cp_attention(ranks, options);
    const auto grads = ref::cp_attention_backward(ranks, d_out, options);
    for (const AttentionRank& e : c.ranks) {
      const std::string at = "row " + std::to_string(b) + " rank " + std::to_string(e.rank);
      const auto& o = outputs[static_cast<std::size_t>(e.rank)];
      const auto& g = grads[static_cast<std::size_t>(e.rank)];
      const std::vector<std::int64_t> mine = local_order(e.positions.size());
      for (std::int64_t h = 0; h < c.hq; ++h) {
        EXPECT_TRUE(close(o.out[h], head_at(e.out[b], mine, h, c.head_dim))) << "out " << at;
        EXPECT_TRUE(close(g.dq[h], head_at(e.dq[b], mine, h, c.head_dim))) << "dq " << at;
        for (std::size_t j = 0; j < mine.size(); ++j)
          EXPECT_TRUE(harness::is_close(o.lse[h](static_cast<Eigen::Index>(j)), e.lse[b][j][h],
                                        kGoldenGradAtol, kGoldenLossRtol))
              << "lse " << at << " token " << j << " head " << h;
        if (!c.sinks.empty()) dsinks[static_cast<std::size_t>(e.rank)][h] += g.dsinks[h];
      }
      for (std::int64_t kh = 0; kh < c.hkv; ++kh) {
        EXPECT_TRUE(close(g.dk[kh], head_at(e.dk[b], mine, kh, c.head_dim))) << "dk " << at;
        EXPECT_TRUE(close(g.dv[kh], head_at(e.dv[b], mine, kh, c.head_dim))) << "dv " << at;
      }
    }
  }
  for (const AttentionRank& e : c.ranks)
    for (std::size_t h = 0; h < c.sinks.size(); ++h)
      EXPECT_TRUE(harness::is_close(dsinks[static_cast<std::size_t>(e.rank)][h], e.dsinks[h],
                                    kGoldenGradAtol, kGoldenLossRtol))
          << "d sinks rank " << e.rank << " head " << h;
}

INSTANTIATE_TEST_SUITE_P(Attention, ReferenceAttentionGolden,
                         ::testing::ValuesIn(golden_case_names(CPKIT_GOLDEN_ATTENTION_DIR)));

// golden/policy: the reference's policy loss against fp64 autograd of the section 5c objective.
class ReferencePolicyGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferencePolicyGolden, ReproducesTheOracle) {
  const PolicyCase c = load_policy_case(GetParam());
  const ref::Sharder s = prepare(c.batch);
  const Json& p = c.policy;
  ref::PolicyLossOptions o;
  o.kind = p.at("kind");
  o.eps_low = p.at("eps_low");
  o.eps_high = p.at("eps_high");
  o.dual_clip = p.at("dual_clip");
  o.kl = p.at("kl");
  o.kl_coef = p.at("kl_coef");
  o.tis_cap = p.at("tis_cap");
  o.entropy_coef = p.at("entropy_coef");
  o.aggregation = p.at("aggregation");
  o.divisor = p.at("divisor");
  o.cp = c.batch.cp;
  o.layout = c.batch.layout == "contiguous" ? ref::LayoutPositions{} : s.global(0).owned;
  std::vector<ref::PolicyRankInputs> ranks;
  for (const PolicyRank& e : c.ranks) {
    const ref::LocalShard l = s.local(0, e.rank);
    ASSERT_EQ(l.layout.positions, e.positions) << "rank " << e.rank;
    Floats2 mine;
    ref::PolicyRankInputs r;
    std::vector<double>* values[] = {&r.advantages, &r.old_logprobs, &r.ref_logprobs,
                                     &r.sampler_logprobs};
    for (std::size_t b = 0; b < c.hidden.size(); ++b)
      for (const std::int64_t j : e.positions) {
        mine.push_back(c.hidden[b][static_cast<std::size_t>(j)]);
        for (std::size_t k = 0; k < 4; ++k)
          values[k]->push_back(c.per_position[k][b][static_cast<std::size_t>(j)]);
      }
    r.hidden = matrix(mine);
    r.labels = l.labels;
    r.valid = l.valid;
    for (Eigen::Index b = 0; b < l.document_ids.rows(); ++b)
      for (Eigen::Index j = 0; j < l.document_ids.cols(); ++j)
        r.sequence_ids.push_back(l.document_ids(b, j));
    ranks.push_back(r);
  }
  const auto got = ref::policy_loss(ranks, matrix(c.weight), o);
  for (const PolicyRank& e : c.ranks) {
    const auto& r = got[static_cast<std::size_t>(e.rank)];
    const std::string at = "rank " + std::to_string(e.rank);
    EXPECT_NEAR(r.loss, e.loss, kGoldenLossRtol * (1 + std::abs(e.loss))) << at;
    const std::vector<double> lp = flat(e.logprobs), ratio = flat(e.ratio);
    ASSERT_EQ(r.logprobs.size(), lp.size()) << at;
    for (std::size_t i = 0; i < lp.size(); ++i) {
      EXPECT_NEAR(r.logprobs[i], lp[i], kGoldenLossRtol * (1 + std::abs(lp[i]))) << at;
      EXPECT_NEAR(r.ratio[i], ratio[i], kGoldenLossRtol * (1 + std::abs(ratio[i]))) << at;
    }
    Floats2 dhidden;
    for (const auto& row : e.dhidden) dhidden.insert(dhidden.end(), row.begin(), row.end());
    EXPECT_TRUE(close(r.grad_hidden, matrix(dhidden))) << "d hidden " << at;
    EXPECT_TRUE(close(r.grad_weight, matrix(e.dweight))) << "d weight " << at;
  }
}

INSTANTIATE_TEST_SUITE_P(Policy, ReferencePolicyGolden,
                         ::testing::ValuesIn(golden_case_names(CPKIT_GOLDEN_POLICY_DIR)));

}  // namespace
}  // namespace cpkit::golden
