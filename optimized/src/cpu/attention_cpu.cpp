// cp_attention's CPU kernels (kernels/attention_launch.hpp). Forward: threads over (query,
// head) pairs, one online-softmax pass over each query's listed keys. Backward: threads over
// key heads, each owning its heads' dk and dv (no atomics; summed in double); each
// probability is recomputed from the saved log-sum-exp, and delta_i = d_out_i . out_i gives
// the softmax's row term.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_launch.hpp"
#include "kernels/attention_math.hpp"

namespace cpkit::kernels {

namespace {

// Eight independent partial sums: a loop the compiler vectorises without reassociating
// floats itself (one running sum would be a serial chain of adds).
float dot(const float* a, const float* b, std::int64_t d) {
  constexpr std::int64_t kLanes = 8;
  float part[kLanes] = {};
  std::int64_t c = 0;
  for (; c + kLanes <= d; c += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) part[l] += a[c + l] * b[c + l];
  float s = 0.0f;
  for (; c < d; ++c) s += a[c] * b[c];
  for (const float p : part) s += p;
  return s;
}

AttentionScore score(const float* q, const float* k, const AttentionArgs& a) {
  return attention_score(dot(q, k, a.d), a.scale, a.softcap);
}

}  // namespace

void attention_forward_cpu(const AttentionArgs& a) {
  const std::int64_t group = a.hq / a.hkv;
  at::parallel_for(0, a.queries * a.hq, 8, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> acc(static_cast<std::size_t>(a.d));
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t i = t / a.hq, h = t % a.hq, g = h / group;
      const float* qi = a.q + t * a.d;
      OnlineRow row = a.sinks != nullptr ? OnlineRow{a.sinks[h], 1.0f} : OnlineRow{-INFINITY, 0.0f};
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::int64_t x = a.key_begin[i]; x < a.key_end[i]; ++x) {
        const std::int64_t slot = a.key_slots[x] - a.slot_offset;
        float p = 0.0f;
        const float shrink =
            online_step(row, score(qi, a.k + (slot * a.hkv + g) * a.d, a).value, p);
        if (shrink != 1.0f)
          for (float& v : acc) v *= shrink;
        const float* vj = a.v + (slot * a.hkv + g) * a.d;
        for (std::int64_t c = 0; c < a.d; ++c) acc[static_cast<std::size_t>(c)] += p * vj[c];
      }
      float* o = a.out + t * a.d;
      if (row.sum == 0.0f) {
        std::fill(o, o + a.d, 0.0f);
        a.lse[t] = -INFINITY;
        continue;
      }
      for (std::int64_t c = 0; c < a.d; ++c) o[c] = acc[static_cast<std::size_t>(c)] / row.sum;
      a.lse[t] = row.max + std::log(row.sum);
    }
  });
}

void attention_backward_cpu(const AttentionArgs& a) {
  const std::int64_t group = a.hq / a.hkv;
  at::parallel_for(0, a.hkv, 1, [&](std::int64_t g_begin, std::int64_t g_end) {
    // A key slot's gradient sums a term from every query that sees it: summed in double,
    // rounded once (a float running sum's error grew with the number of queries).
    std::vector<double> dk(static_cast<std::size_t>(a.keys * a.d));
    std::vector<double> dv(dk.size()), dq(static_cast<std::size_t>(a.d));
    for (std::int64_t g = g_begin; g < g_end; ++g) {
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        double dsink = 0.0;
        for (std::int64_t i = 0; i < a.queries; ++i) {
          const std::int64_t t = i * a.hq + h;
          const float* qi = a.q + t * a.d;
          const float* doi = a.d_out + t * a.d;
          std::fill(dq.begin(), dq.end(), 0.0);
          const float lse = a.lse[t];
          if (lse != -INFINITY) {  // else nothing seen: zero gradients
            const float delta = dot(doi, a.out + t * a.d, a.d);
            if (a.sinks != nullptr) dsink -= std::exp(a.sinks[h] - lse) * delta;
            for (std::int64_t x = a.key_begin[i]; x < a.key_end[i]; ++x) {
              const std::int64_t slot = a.key_slots[x] - a.slot_offset;
              const std::int64_t at = (slot * a.hkv + g) * a.d;
              const AttentionScore s = score(qi, a.k + at, a);
              const float p = std::exp(s.value - lse);
              const float ds = p * (dot(doi, a.v + at, a.d) - delta) * s.slope * a.scale;
              double* dk_slot = dk.data() + slot * a.d;
              double* dv_slot = dv.data() + slot * a.d;
              for (std::int64_t c = 0; c < a.d; ++c) {
                const auto e = static_cast<std::size_t>(c);
                dq[e] += static_cast<double>(ds) * a.k[at + c];
                dk_slot[c] += static_cast<double>(ds) * qi[c];
                dv_slot[c] += static_cast<double>(p) * doi[c];
              }
            }
          }
          float* dqi = a.dq + t * a.d;
          for (std::int64_t c = 0; c < a.d; ++c)
            dqi[c] = static_cast<float>(dq[static_cast<std::size_t>(c)]);
        }
        if (a.sinks != nullptr) a.dsinks[h] = static_cast<float>(dsink);
      }
      for (std::int64_t slot = 0; slot < a.keys; ++slot)
        for (std::int64_t c = 0; c < a.d; ++c) {
          const auto e = static_cast<std::size_t>(slot * a.d + c);
          a.dk[(slot * a.hkv + g) * a.d + c] = static_cast<float>(dk[e]);
          a.dv[(slot * a.hkv + g) * a.d + c] = static_cast<float>(dv[e]);
        }
    }
  });
}

}  // namespace cpkit::kernels
