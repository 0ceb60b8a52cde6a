// cp_attention's CPU kernels on raw arguments against attention written out in double from its
// definition: queries whose listed key ranges are causal, windowed, full, empty or arbitrary,
// in runs that start and stop anywhere in a tile, over key lists longer than several blocks,
// with slots listed in any order (repeats included) past a slot offset; GQA, sinks, a soft
// cap, D not a multiple of the vector width. The dispatched kernels (AVX2 where the CPU has
// it) and the tiles compiled here with this file's flags (the baseline build's code) both
// run; results may not depend on the thread count.
#define CPKIT_ROWS_NAMESPACE tested
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/attention_tiles.hpp"

namespace cpkit::kernels {
namespace {

struct Case {
  std::int64_t queries = 0, keys = 0, hq = 4, hkv = 2, d = 0, slot_offset = 0;
  float scale = 0.0f, softcap = 0.0f;
  std::vector<float> q, k, v, d_out, sinks;
  std::vector<std::int64_t> slots, begin, end;
};

Case random_case(unsigned seed, bool with_sinks, float softcap) {
  std::mt19937 gen(seed);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen);
  };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  c.queries = uniform(60, 200);
  c.keys = uniform(100, 300);
  c.d = uniform(1, 3) == 1 ? 8 : uniform(3, 40);
  c.slot_offset = uniform(0, 50);
  c.scale = 0.3f + 0.5f * std::uniform_real_distribution<float>()(gen);
  c.softcap = softcap;
  // The listed keys: any slots, in any order, repeats allowed.
  const std::int64_t listed = uniform(150, 500);
  for (std::int64_t x = 0; x < listed; ++x)
    c.slots.push_back(c.slot_offset + uniform(0, c.keys - 1));
  // Runs of queries: causal, windowed, full, empty or arbitrary ranges of the list.
  while (static_cast<std::int64_t>(c.begin.size()) < c.queries) {
    const std::int64_t run = uniform(1, 40), mode = uniform(0, 4), start = uniform(0, listed - 1);
    const std::int64_t prefix = uniform(0, 100), window = uniform(1, 90);
    for (std::int64_t t = 0; t < run && static_cast<std::int64_t>(c.begin.size()) < c.queries;
         ++t) {
      std::int64_t b = start, e = std::min(listed, start + prefix + t + 1);
      if (mode == 1) b = std::max(start, e - window);
      if (mode == 2) e = std::min(listed, start + prefix + 1);
      if (mode == 3) e = b;
      if (mode == 4) {
        b = uniform(0, listed);
        e = uniform(b, listed);
      }
      c.begin.push_back(b);
      c.end.push_back(e);
    }
  }
  auto fill = [&](std::vector<float>& x, std::int64_t n, float sd) {
    x.resize(static_cast<std::size_t>(n));
    for (float& value : x) value = sd * normal(gen);
  };
  // Wide scores, so a later block's max exceeds an earlier one's.
  fill(c.q, c.queries * c.hq * c.d, 2.0f);
  fill(c.k, c.keys * c.hkv * c.d, 1.0f);
  fill(c.v, c.keys * c.hkv * c.d, 1.0f);
  fill(c.d_out, c.queries * c.hq * c.d, 1.0f);
  if (with_sinks) fill(c.sinks, c.hq, 2.0f);
  return c;
}

struct Results {
  std::vector<float> out, lse, dq, dk, dv, dsinks;
};

Results run(const Case& c, bool dispatched) {
  Results r;
  r.out.resize(c.q.size());
  r.lse.resize(static_cast<std::size_t>(c.queries * c.hq));
  r.dq.resize(c.q.size());
  r.dk.resize(c.k.size());
  r.dv.resize(c.v.size());
  r.dsinks.resize(c.sinks.size());
  AttentionArgs a{};
  a.q = c.q.data();
  a.k = c.k.data();
  a.v = c.v.data();
  a.key_slots = c.slots.data();
  a.key_begin = c.begin.data();
  a.key_end = c.end.data();
  a.slot_offset = c.slot_offset;
  a.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
  a.queries = c.queries;
  a.keys = c.keys;
  a.hq = c.hq;
  a.hkv = c.hkv;
  a.d = c.d;
  a.scale = c.scale;
  a.softcap = c.softcap;
  a.out = r.out.data();
  a.lse = r.lse.data();
  a.d_out = c.d_out.data();
  a.dq = r.dq.data();
  a.dk = r.dk.data();
  a.dv = r.dv.data();
  a.dsinks = r.dsinks.data();
  if (dispatched) {
    attention_forward_cpu(a);
    attention_backward_cpu(a);
  } else {
    tested::run_attention_forward(a);
    tested::run_attention_backward(a);
  }
  return r;
}

// The definition in double: softmax over each query's listed keys (and its head's sink).
Results expected(const Case& c) {
  Results r;
  std::vector<double> out(c.q.size()), dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
  std::vector<double> lse(static_cast<std::size_t>(c.queries * c.hq)), dsinks(c.sinks.size());
  const std::int64_t group = c.hq / c.hkv, d = c.d;
  for (std::int64_t i = 0; i < c.queries; ++i)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::int64_t t = i * c.hq + h, g = h / group;
      const float* q = c.q.data() + t * d;
      const float* dout = c.d_out.data() + t * d;
      std::vector<double> score, slope;
      std::vector<std::int64_t> at;
      for (std::int64_t x = c.begin[static_cast<std::size_t>(i)];
           x < c.end[static_cast<std::size_t>(i)]; ++x) {
        const std::int64_t row =
            ((c.slots[static_cast<std::size_t>(x)] - c.slot_offset) * c.hkv + g) * d;
        double dotted = 0.0;
        for (std::int64_t e = 0; e < d; ++e)
          dotted += static_cast<double>(q[e]) * c.k[static_cast<std::size_t>(row + e)];
        const double s = dotted * c.scale;
        const double tanh_s = c.softcap > 0 ? std::tanh(s / c.softcap) : 0.0;
        score.push_back(c.softcap > 0 ? c.softcap * tanh_s : s);
        slope.push_back(c.softcap > 0 ? 1.0 - tanh_s * tanh_s : 1.0);
        at.push_back(row);
      }
      double m = c.sinks.empty() ? -INFINITY : c.sinks[static_cast<std::size_t>(h)];
      for (const double s : score) m = std::max(m, s);
      if (m == -INFINITY) {
        lse[static_cast<std::size_t>(t)] = -INFINITY;
        continue;  // nothing seen: zero output and gradients
      }
      double z = c.sinks.empty() ? 0.0 : std::exp(c.sinks[static_cast<std::size_t>(h)] - m);
      for (const double s : score) z += std::exp(s - m);
      const double l = m + std::log(z);
      lse[static_cast<std::size_t>(t)] = l;
      std::vector<double> p(score.size()), dp(score.size());
      double delta = 0.0;
      for (std::size_t x = 0; x < score.size(); ++x) {
        p[x] = std::exp(score[x] - l);
        for (std::int64_t e = 0; e < d; ++e) {
          out[static_cast<std::size_t>(t * d + e)] +=
              p[x] * c.v[static_cast<std::size_t>(at[x] + e)];
          dp[x] += static_cast<double>(dout[e]) * c.v[static_cast<std::size_t>(at[x] + e)];
        }
        delta += p[x] * dp[x];
      }
      if (!c.sinks.empty())
        dsinks[static_cast<std::size_t>(h)] -=
            std::exp(c.sinks[static_cast<std::size_t>(h)] - l) * delta;
      for (std::size_t x = 0; x < score.size(); ++x) {
        const double ds = p[x] * (dp[x] - delta) * slope[x] * c.scale;
        for (std::int64_t e = 0; e < d; ++e) {
          const auto ke = static_cast<std::size_t>(at[x] + e);
          dq[static_cast<std::size_t>(t * d + e)] += ds * c.k[ke];
          dk[ke] += ds * q[e];
          dv[ke] += p[x] * dout[e];
        }
      }
    }
  auto to_float = [](const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
  };
  return {to_float(out), to_float(lse), to_float(dq), to_float(dk), to_float(dv), to_float(dsinks)};
}

// |got - want| <= atol + rtol |want| everywhere; fails on NaN; -inf must match exactly.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                  unsigned seed) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (std::isinf(want[e])) {
      ASSERT_EQ(got[e], want[e]) << what << "[" << e << "], seed " << seed;
      continue;
    }
    ASSERT_TRUE(std::abs(got[e] - want[e]) <= 2e-4f + 2e-4f * std::abs(want[e]))
        << what << "[" << e << "] = " << got[e] << ", expected " << want[e] << ", seed " << seed;
  }
}

void expect_results(const Results& got, const Results& want, unsigned seed) {
  expect_close(got.out, want.out, "out", seed);
  expect_close(got.lse, want.lse, "lse", seed);
  expect_close(got.dq, want.dq, "dq", seed);
  expect_close(got.dk, want.dk, "dk", seed);
  expect_close(got.dv, want.dv, "dv", seed);
  expect_close(got.dsinks, want.dsinks, "dsinks", seed);
}

TEST(AttentionKernel, TilesEqualAttentionInDouble) {
  for (unsigned seed = 1; seed <= 24; ++seed) {
    const Case c = random_case(seed, seed % 3 == 0, seed % 4 == 1 ? 4.0f : 0.0f);
    const Results want = expected(c);
    expect_results(run(c, true), want, seed);
    expect_results(run(c, false), want, seed);
  }
}

// A tile's rows share each gathered block, so a row far from the others would score many
// keys it does not keep: consecutive causal queries share a tile; another piece of the same
// document far along it, or another document, starts a new one.
TEST(AttentionKernel, TilesHoldQueriesWhoseRangesAreClose) {
  std::vector<std::int64_t> begin, end;
  for (std::int64_t q = 0; q < 20; ++q) {  // a head piece: keys [0, 100 + q]
    begin.push_back(0);
    end.push_back(101 + q);
  }
  for (std::int64_t q = 0; q < 5; ++q) {  // the same document's tail piece, far along it
    begin.push_back(0);
    end.push_back(5001 + q);
  }
  begin.push_back(6000);  // another document
  end.push_back(6001);
  AttentionArgs a{};
  a.queries = static_cast<std::int64_t>(begin.size());
  a.key_begin = begin.data();
  a.key_end = end.data();
  const std::vector<tested::QueryTile> tiles = tested::query_tiles(a);
  ASSERT_EQ(tiles.size(), 4u);
  const std::int64_t firsts[] = {0, 16, 20, 25}, key_ends[] = {116, 120, 5005, 6001};
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    EXPECT_EQ(tiles[t].first, firsts[t]) << t;
    EXPECT_EQ(tiles[t].key_end, key_ends[t]) << t;
    EXPECT_EQ(tiles[t].last, t + 1 < tiles.size() ? firsts[t + 1] : a.queries) << t;
  }
}

TEST(AttentionKernel, ResultsDoNotDependOnTheThreadCount) {
  const int threads = at::get_num_threads();
  const Case c = random_case(7, true, 0.0f);
  at::set_num_threads(1);
  const Results one = run(c, true);
  at::set_num_threads(3);
  const Results three = run(c, true);
  at::set_num_threads(threads);
  for (const auto member :
       {&Results::out, &Results::lse, &Results::dq, &Results::dk, &Results::dv, &Results::dsinks})
    EXPECT_EQ(one.*member, three.*member);
}

}  // namespace
}  // namespace cpkit::kernels
