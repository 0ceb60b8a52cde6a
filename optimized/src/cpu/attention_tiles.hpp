// cp_attention's CPU kernels in tiles (built twice, baseline and AVX2 + FMA, like the CE row
// loops). A tile is up to kTileQueries consecutive queries whose listed key ranges lie within
// a block of each other (one piece of a document, in practice); its keys are read in blocks of
// kTileKeys, each block gathered once per tile and key head (transposed) and scored against every
// query head of that key head in a loop over the block's keys the compiler vectorises. Each query
// keeps exactly its own range [key_begin, key_end) of the block. Forward: one online-softmax
// step per block; work items (tile, key head) in parallel. Backward: threads over key heads,
// each owning its heads' dk and dv, summed in double per block (no atomics); each
// probability recomputed from the saved log-sum-exp, delta = d_out . out the softmax's row
// term. Results do not depend on the thread count.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_launch.hpp"
#include "kernels/attention_math.hpp"
#include "kernels/cross_entropy.hpp"

namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE {

constexpr std::int64_t kTileQueries = 16;
constexpr std::int64_t kTileKeys = 64;

// Queries [first, last) and the union [key_begin, key_end) of their listed key ranges.
struct QueryTile {
  std::int64_t first, last, key_begin, key_end;
};

// Consecutive queries join a tile while it has room and their range lies within a block of
// the tile's union at both ends (or either is empty): a new document, or another piece of the
// same document far along it, starts a new tile, so no row scores many keys it does not keep.
inline std::vector<QueryTile> query_tiles(const AttentionArgs& a) {
  std::vector<QueryTile> tiles;
  QueryTile t{0, 0, 0, 0};
  for (std::int64_t i = 0; i < a.queries; ++i) {
    const std::int64_t b = a.key_begin[i], e = a.key_end[i];
    const bool empty = b >= e, tile_empty = t.key_begin >= t.key_end;
    const bool close =
        std::abs(b - t.key_begin) <= kTileKeys && std::abs(e - t.key_end) <= kTileKeys;
    if (i - t.first >= kTileQueries || !(empty || tile_empty || close)) {
      tiles.push_back(t);
      t = {i, i, 0, 0};
    }
    t.last = i + 1;
    if (empty) continue;
    const bool first_range = t.key_begin >= t.key_end;
    t.key_begin = first_range ? b : std::min(t.key_begin, b);
    t.key_end = first_range ? e : std::max(t.key_end, e);
  }
  if (a.queries > 0) tiles.push_back(t);
  return tiles;
}

// One thread's buffers for a block of listed keys of one key head: row pointers into k and
// v, k and v transposed [d, kTileKeys] (zeroed once: columns past a short block stay finite).
struct KeyBlock {
  explicit KeyBlock(std::int64_t d) : kt(static_cast<std::size_t>(d * kTileKeys)), vt(kt.size()) {}
  std::vector<float> kt, vt;
  const float* k_rows[kTileKeys] = {};
  const float* v_rows[kTileKeys] = {};
  std::int64_t first = 0, size = 0;  // listed keys [first, first + size)

  void gather(const AttentionArgs& a, std::int64_t g, std::int64_t x0, std::int64_t x1,
              bool values_transposed) {
    first = x0;
    size = std::min(x1 - x0, kTileKeys);
    for (std::int64_t j = 0; j < size; ++j) {
      const std::int64_t at = ((a.key_slots[x0 + j] - a.slot_offset) * a.hkv + g) * a.d;
      k_rows[j] = a.k + at;
      v_rows[j] = a.v + at;
      for (std::int64_t c = 0; c < a.d; ++c)
        kt[static_cast<std::size_t>(c * kTileKeys + j)] = a.k[at + c];
      if (values_transposed)
        for (std::int64_t c = 0; c < a.d; ++c)
          vt[static_cast<std::size_t>(c * kTileKeys + j)] = a.v[at + c];
    }
  }

  // The block's columns query i keeps: [lo, hi) (empty when lo >= hi).
  std::pair<std::int64_t, std::int64_t> kept(const AttentionArgs& a, std::int64_t i) const {
    return {std::max(a.key_begin[i], first) - first, std::min(a.key_end[i], first + size) - first};
  }
};

// out[j] = x . column j of `transposed` [d, kTileKeys], for every column of the block.
inline void block_dots(const float* x, const float* transposed, std::int64_t d, float* out) {
  for (std::int64_t j = 0; j < kTileKeys; ++j) out[j] = 0.0f;
  for (std::int64_t c = 0; c < d; ++c) {
    const float xc = x[c];
    const float* column = transposed + c * kTileKeys;
    for (std::int64_t j = 0; j < kTileKeys; ++j) out[j] += xc * column[j];
  }
}

// Eight floats as one vector (GCC's vector extension: a ymm register in the AVX2 build, two
// xmm in the baseline); Float8In reads one from any float address (4-byte aligned, may alias
// float). Never passed or returned by value (the baseline ABI has no ymm).
using Float8 = float __attribute__((vector_size(32)));
using Float8In = float __attribute__((vector_size(32), aligned(4), may_alias));

// y[c0, ...) += the sum over j in [lo, hi) of w[j * stride] * rows[j][c0, ...), 8 * kVectors
// floats at a time while they fit in d, each slice of y held in registers for the whole sum
// (kVectors independent chains: no load and store of y per row); returns where it stopped.
template <int kVectors>
std::int64_t accumulate_slices(const float* w, std::int64_t stride, const float* const* rows,
                               std::int64_t lo, std::int64_t hi, float* y, std::int64_t c0,
                               std::int64_t d) {
  constexpr std::int64_t kWidth = 8 * kVectors;
  for (; c0 + kWidth <= d; c0 += kWidth) {
    Float8 acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = *reinterpret_cast<const Float8In*>(y + c0 + 8 * v);
    for (std::int64_t j = lo; j < hi; ++j) {
      const float wj = w[j * stride];
      const float* row = rows[j] + c0;
      for (int v = 0; v < kVectors; ++v)
        acc[v] += wj * *reinterpret_cast<const Float8In*>(row + 8 * v);
    }
    for (int v = 0; v < kVectors; ++v) *reinterpret_cast<Float8In*>(y + c0 + 8 * v) = acc[v];
  }
  return c0;
}

// y[0, d) += the sum over j in [lo, hi) of w[j * stride] * rows[j][0, d).
inline void accumulate_rows(const float* w, std::int64_t stride, const float* const* rows,
                            std::int64_t lo, std::int64_t hi, float* y, std::int64_t d) {
  const std::int64_t c0 = accumulate_slices<1>(
      w, stride, rows, lo, hi, y, accumulate_slices<4>(w, stride, rows, lo, hi, y, 0, d), d);
  for (std::int64_t c = c0; c < d; ++c) {
    float acc = y[c];
    for (std::int64_t j = lo; j < hi; ++j) acc += w[j * stride] * rows[j][c];
    y[c] = acc;
  }
}

// Once per query head per backward: not worth vectorising.
inline float dot(const float* a, const float* b, std::int64_t d) {
  float s = 0.0f;
  for (std::int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// attention_score's value over the block's columns [lo, hi), in place; returns their max.
// kCapped = false folds the cap's branch away, so the loop vectorises.
template <bool kCapped>
float block_scores(const AttentionArgs& a, float* s, std::int64_t lo, std::int64_t hi) {
  const float softcap = kCapped ? a.softcap : 0.0f;
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (std::int64_t j = lo; j < hi; ++j) {
    s[j] = attention_score(s[j], a.scale, softcap).value;
    m = std::max(m, s[j]);
  }
  return m;
}

template <bool kCapped>
void attention_forward(const AttentionArgs& a) {
  const std::vector<QueryTile> tiles = query_tiles(a);
  const std::int64_t group = a.hq / a.hkv, items = static_cast<std::int64_t>(tiles.size()) * a.hkv;
  at::parallel_for(0, items, 1, [&](std::int64_t begin, std::int64_t end) {
    KeyBlock block(a.d);
    float s[kTileKeys], p[kTileKeys];
    std::vector<float> acc(static_cast<std::size_t>(kTileQueries * group * a.d));
    std::vector<OnlineRow> rows(static_cast<std::size_t>(kTileQueries * group));
    for (std::int64_t item = begin; item < end; ++item) {
      const QueryTile& tile = tiles[static_cast<std::size_t>(item / a.hkv)];
      const std::int64_t g = item % a.hkv, n_rows = (tile.last - tile.first) * group;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::int64_t r = 0; r < n_rows; ++r) {
        const std::int64_t h = g * group + r % group;
        rows[static_cast<std::size_t>(r)] =
            a.sinks != nullptr ? OnlineRow{a.sinks[h], 1.0f} : OnlineRow{-INFINITY, 0.0f};
      }
      for (std::int64_t x0 = tile.key_begin; x0 < tile.key_end; x0 += kTileKeys) {
        block.gather(a, g, x0, tile.key_end, false);
        for (std::int64_t r = 0; r < n_rows; ++r) {
          const std::int64_t i = tile.first + r / group, h = g * group + r % group;
          const auto [lo, hi] = block.kept(a, i);
          if (lo >= hi) continue;
          block_dots(a.q + (i * a.hq + h) * a.d, block.kt.data(), a.d, s);
          const float m = block_scores<kCapped>(a, s, lo, hi);
          OnlineRow& row = rows[static_cast<std::size_t>(r)];
          float* acc_r = acc.data() + r * a.d;
          const float shrink = online_rescale(row, m);
          if (shrink != 1.0f)
            for (std::int64_t c = 0; c < a.d; ++c) acc_r[c] *= shrink;
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (std::int64_t j = lo; j < hi; ++j) {
            p[j] = fast_exp(s[j] - row.max);
            sum += p[j];
          }
          row.sum += sum;
          accumulate_rows(p, 1, block.v_rows, lo, hi, acc_r, a.d);
        }
      }
      for (std::int64_t r = 0; r < n_rows; ++r) {
        const std::int64_t t = (tile.first + r / group) * a.hq + g * group + r % group;
        const OnlineRow& row = rows[static_cast<std::size_t>(r)];
        float* o = a.out + t * a.d;
        const float* acc_r = acc.data() + r * a.d;
        if (row.sum == 0.0f) {
          std::fill(o, o + a.d, 0.0f);
          a.lse[t] = -INFINITY;
          continue;
        }
        for (std::int64_t c = 0; c < a.d; ++c) o[c] = acc_r[c] / row.sum;
        a.lse[t] = row.max + std::log(row.sum);
      }
    }
  });
}

template <bool kCapped>
void attention_backward(const AttentionArgs& a) {
  const std::vector<QueryTile> tiles = query_tiles(a);
  const std::int64_t group = a.hq / a.hkv, d = a.d;
  at::parallel_for(0, a.hkv, 1, [&](std::int64_t g_begin, std::int64_t g_end) {
    KeyBlock block(d);
    float s[kTileKeys], dpv[kTileKeys];
    const std::int64_t max_rows = kTileQueries * group;
    // Per block: each row's probabilities and score gradients (0 past its kept columns), then
    // dq by row and dk, dv by key. A key slot's gradient sums a term from every query that
    // sees it: per block in float (at most max_rows terms), across blocks in double.
    std::vector<float> p(static_cast<std::size_t>(max_rows * kTileKeys)), ds(p.size());
    std::vector<const float*> q_rows(static_cast<std::size_t>(max_rows));
    std::vector<const float*> d_out_rows(q_rows.size());
    std::vector<double> dk(static_cast<std::size_t>(a.keys * d)), dv(dk.size());
    std::vector<float> dk_j(static_cast<std::size_t>(d)), dv_j(dk_j.size()), dq_block(dk_j.size());
    std::vector<double> dq(static_cast<std::size_t>(max_rows * d));
    std::vector<double> dsinks(static_cast<std::size_t>(group));
    std::vector<float> delta(static_cast<std::size_t>(max_rows));
    for (std::int64_t g = g_begin; g < g_end; ++g) {
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      std::fill(dsinks.begin(), dsinks.end(), 0.0);
      for (const QueryTile& tile : tiles) {
        const std::int64_t n_rows = (tile.last - tile.first) * group;
        std::fill(dq.begin(), dq.end(), 0.0);
        for (std::int64_t r = 0; r < n_rows; ++r) {
          const std::int64_t t = (tile.first + r / group) * a.hq + g * group + r % group;
          const auto e = static_cast<std::size_t>(r);
          q_rows[e] = a.q + t * d;
          d_out_rows[e] = a.d_out + t * d;
          delta[e] = dot(a.d_out + t * d, a.out + t * d, d);
          if (a.sinks != nullptr && a.lse[t] != -INFINITY)
            dsinks[static_cast<std::size_t>(r % group)] -=
                std::exp(a.sinks[g * group + r % group] - a.lse[t]) * delta[e];
        }
        for (std::int64_t x0 = tile.key_begin; x0 < tile.key_end; x0 += kTileKeys) {
          block.gather(a, g, x0, tile.key_end, true);
          for (std::int64_t r = 0; r < n_rows; ++r) {
            const std::int64_t i = tile.first + r / group;
            const std::int64_t t = i * a.hq + g * group + r % group;
            float* p_r = p.data() + r * kTileKeys;
            float* ds_r = ds.data() + r * kTileKeys;
            std::fill(p_r, p_r + kTileKeys, 0.0f);
            std::fill(ds_r, ds_r + kTileKeys, 0.0f);
            const auto [lo, hi] = block.kept(a, i);
            const float lse = a.lse[t];
            if (lo >= hi || lse == -INFINITY) continue;  // nothing seen: zero gradients
            block_dots(q_rows[static_cast<std::size_t>(r)], block.kt.data(), d, s);
            block_dots(d_out_rows[static_cast<std::size_t>(r)], block.vt.data(), d, dpv);
            const float softcap = kCapped ? a.softcap : 0.0f,
                        delta_r = delta[static_cast<std::size_t>(r)];
            for (std::int64_t j = lo; j < hi; ++j) {
              const AttentionScore sc = attention_score(s[j], a.scale, softcap);
              p_r[j] = fast_exp(sc.value - lse);
              ds_r[j] = p_r[j] * (dpv[j] - delta_r) * sc.slope * a.scale;
            }
            std::fill(dq_block.begin(), dq_block.end(), 0.0f);
            accumulate_rows(ds_r, 1, block.k_rows, lo, hi, dq_block.data(), d);
            double* dq_r = dq.data() + r * d;
            for (std::int64_t c = 0; c < d; ++c) dq_r[c] += dq_block[static_cast<std::size_t>(c)];
          }
          for (std::int64_t j = 0; j < block.size; ++j) {
            std::fill(dk_j.begin(), dk_j.end(), 0.0f);
            std::fill(dv_j.begin(), dv_j.end(), 0.0f);
            accumulate_rows(ds.data() + j, kTileKeys, q_rows.data(), 0, n_rows, dk_j.data(), d);
            accumulate_rows(p.data() + j, kTileKeys, d_out_rows.data(), 0, n_rows, dv_j.data(), d);
            const std::int64_t slot = a.key_slots[x0 + j] - a.slot_offset;
            for (std::int64_t c = 0; c < d; ++c) {
              const auto e = static_cast<std::size_t>(slot * d + c);
              dk[e] += dk_j[static_cast<std::size_t>(c)];
              dv[e] += dv_j[static_cast<std::size_t>(c)];
            }
          }
        }
        for (std::int64_t r = 0; r < n_rows; ++r) {
          const std::int64_t t = (tile.first + r / group) * a.hq + g * group + r % group;
          for (std::int64_t c = 0; c < d; ++c)
            a.dq[t * d + c] = static_cast<float>(dq[static_cast<std::size_t>(r * d + c)]);
        }
      }
      if (a.sinks != nullptr)
        for (std::int64_t h = 0; h < group; ++h)
          a.dsinks[g * group + h] = static_cast<float>(dsinks[static_cast<std::size_t>(h)]);
      for (std::int64_t slot = 0; slot < a.keys; ++slot)
        for (std::int64_t c = 0; c < d; ++c) {
          const auto e = static_cast<std::size_t>(slot * d + c);
          a.dk[(slot * a.hkv + g) * d + c] = static_cast<float>(dk[e]);
          a.dv[(slot * a.hkv + g) * d + c] = static_cast<float>(dv[e]);
        }
    }
  });
}

inline void run_attention_forward(const AttentionArgs& a) {
  if (a.softcap > 0.0f) return attention_forward<true>(a);
  attention_forward<false>(a);
}

inline void run_attention_backward(const AttentionArgs& a) {
  if (a.softcap > 0.0f) return attention_backward<true>(a);
  attention_backward<false>(a);
}

}  // namespace cpkit::kernels::CPKIT_ROWS_NAMESPACE
