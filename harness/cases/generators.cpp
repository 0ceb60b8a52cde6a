#include "generators.hpp"

#include <algorithm>
#include <random>
#include <sstream>

#include "closeness.hpp"

namespace cpkit::harness {

using reference::FloatRows;
using reference::IntMatrix;
using reference::kIgnoreLabel;
using reference::kSeqLenSentinel;

namespace {

// The blockings whose edges gen_vocab weights (optimized/src/cpu/vocab_slices.hpp's
// kVocabSlice, cpu/cross_entropy_rows.hpp's kBlock, AVX2 float lanes, CUDA float4).
constexpr int kVocabBlockings[] = {2048, 512, 8, 4};
// spec 2b: the balanced layout cuts documents of at least 2 * CP * kLongChunk tokens.
constexpr int kLongChunk = 64;

IntMatrix random_labels(Eigen::Index rows, Eigen::Index cols, int vocab, int ignore_percent,
                        std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> label(0, vocab - 1);
  std::uniform_int_distribution<int> percent(0, 99);
  IntMatrix labels(rows, cols);
  for (Eigen::Index i = 0; i < labels.size(); ++i)
    labels.data()[i] = percent(rng) < ignore_percent ? kIgnoreLabel : label(rng);
  return labels;
}

IntMatrix random_ids(Eigen::Index rows, Eigen::Index cols, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> id(1, std::max(1, vocab - 1));
  IntMatrix ids(rows, cols);
  for (Eigen::Index i = 0; i < ids.size(); ++i) ids.data()[i] = id(rng);
  return ids;
}

FloatRows random_embeds(Eigen::Index rows, Eigen::Index cols, int hidden, std::uint64_t seed) {
  FloatRows embeds;
  for (Eigen::Index b = 0; b < rows; ++b)
    embeds.push_back(random_floats(cols, hidden, 1.0f, input_seed(seed, Input::kEmbeds, b)));
  return embeds;
}

// Real rows' positions: a random start, then +1 steps with restarts (documents packed into a
// BSHD row) and gaps (left padding, dropped tokens).
IntMatrix random_positions(Eigen::Index rows, Eigen::Index cols, bool increasing,
                           std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> start(0, 100), restart(0, 3), gap(2, 6);
  std::uniform_int_distribution<int> percent(0, 99);
  IntMatrix positions(rows, cols);
  for (Eigen::Index b = 0; b < rows; ++b) {
    std::int64_t p = start(rng);
    for (Eigen::Index t = 0; t < cols; ++t) {
      positions(b, t) = p;
      const int roll = percent(rng);
      p = roll < 10 && !increasing ? restart(rng) : (roll < 20 ? p + gap(rng) : p + 1);
    }
  }
  return positions;
}

rc::Gen<int> gen_ignore_percent() { return rc::gen::element(0, 0, 20, 50, 100); }
rc::Gen<float> gen_logit_scale() { return rc::gen::element(1.0f, 1.0f, 30.0f, 1e4f); }

}  // namespace

FloatMatrix random_floats(Eigen::Index rows, Eigen::Index cols, float scale, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  FloatMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

rc::Gen<int> gen_vocab() {
  std::vector<rc::Gen<int>> edges;
  for (const int block : kVocabBlockings)
    edges.push_back(rc::gen::map(
        rc::gen::pair(rc::gen::inRange(1, 3000 / block + 1), rc::gen::element(-1, 0, 1)),
        [block](const std::pair<int, int>& kd) {
          return std::max(2, kd.first * block + kd.second);
        }));
  return rc::gen::oneOf(rc::gen::inRange(2, 8), rc::gen::inRange(2, 3000), edges[0], edges[1],
                        edges[2], edges[3]);
}

rc::Gen<int> gen_production_vocab() {
  return rc::gen::element(50257, 32000, 32768, 128256, 131072, 151936);
}

rc::Gen<BshdCase> gen_bshd_case() {
  return rc::gen::exec([] {
    BshdCase c;
    c.cp = *rc::gen::inRange(1, 9);
    c.num_chunks = *rc::gen::inRange(1, 4);
    c.rows_per_chunk = *rc::gen::inRange(1, 3);
    // Short sequences reach S < CP; multiples of CP appear by chance and by shrinking.
    c.seq_len = *rc::gen::oneOf(rc::gen::inRange(1, 9), rc::gen::inRange(1, 40));
    c.pad_multiple = *rc::gen::inRange(1, 4);
    c.hidden = *rc::gen::inRange(1, 5);
    c.vocab = *gen_vocab();
    c.use_embeds = *rc::gen::arbitrary<bool>();
    c.use_mask = *rc::gen::arbitrary<bool>();
    c.use_positions = *rc::gen::arbitrary<bool>();
    c.shard_primary = *rc::gen::arbitrary<bool>();
    c.pad_token_id = *rc::gen::inRange<std::int64_t>(0, 3);
    c.ignore_percent = *gen_ignore_percent();
    c.logit_scale = *gen_logit_scale();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

rc::Gen<BshdCase> gen_attention_bshd_case() {
  return rc::gen::map(gen_bshd_case(), [](BshdCase c) {
    c.edge_mask_only = true;
    c.increasing_positions = true;
    return c;
  });
}

rc::Gen<PackedCase> gen_packed_case() {
  return rc::gen::exec([] {
    PackedCase c;
    c.cp = *rc::gen::inRange(1, 9);
    c.pad_multiple = *rc::gen::inRange(1, 4);
    c.hidden = *rc::gen::inRange(1, 5);
    c.vocab = *gen_vocab();
    c.use_embeds = *rc::gen::arbitrary<bool>();
    c.shard_primary = *rc::gen::arbitrary<bool>();
    c.pad_token_id = *rc::gen::inRange<std::int64_t>(0, 3);
    const int num_rows = *rc::gen::inRange(1, 4);
    for (int r = 0; r < num_rows; ++r) {
      const int docs = *rc::gen::inRange(1, 7);
      std::vector<Doc> row;
      for (int d = 0; d < docs; ++d) {
        Doc doc;
        // Lengths 0 and 1 on purpose; long ones straddle several shards.
        doc.length = *rc::gen::oneOf(rc::gen::element(0, 1), rc::gen::inRange(0, 30));
        doc.extra = *rc::gen::element(0, 0, 1, 3);
        row.push_back(doc);
      }
      c.rows.push_back(row);
    }
    // One case in eight holds a document on the balanced layout's long threshold (exactly
    // 2 * CP * 64 tokens, or one fewer); half the rows end exactly on a multiple of
    // 2 * CP * pad_multiple, so that no layout pads and every rank's slots fill it exactly.
    if (*rc::gen::inRange(0, 8) == 0)
      c.rows[0][0].length = 2 * c.cp * kLongChunk - *rc::gen::inRange(0, 2);
    int slots = 0;
    for (const auto& row : c.rows) {
      int used = 0;
      for (const Doc& d : row) used += d.length + d.extra;
      slots = std::max(slots, used);
    }
    const int multiple = 2 * c.cp * c.pad_multiple;
    const int fill = (multiple - slots % multiple) % multiple;
    c.tail = *rc::gen::element(0, 1, 5, fill, fill, fill);
    c.sentinels = *rc::gen::inRange(0, 3);
    c.ignore_percent = *gen_ignore_percent();
    c.logit_scale = *gen_logit_scale();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

ShardOptions options_of(const BshdCase& c) {
  return {c.cp, c.num_chunks, c.pad_multiple, c.pad_token_id, c.shard_primary, c.layout};
}

ShardOptions options_of(const PackedCase& c) {
  return {c.cp,    static_cast<int>(c.rows.size()), c.pad_multiple, c.pad_token_id, c.shard_primary,
          c.layout};
}

rc::Gen<std::string> gen_bshd_layout() { return rc::gen::just(std::string("head_tail")); }

rc::Gen<std::string> gen_packed_layout() {
  return rc::gen::element(std::string("head_tail"), std::string("balanced"));
}

BshdBatch make_batch(const BshdCase& c) {
  std::mt19937_64 rng(input_seed(c.seed, Input::kIds));
  const Eigen::Index B = static_cast<Eigen::Index>(c.num_chunks) * c.rows_per_chunk;
  const Eigen::Index S = c.seq_len;
  BshdBatch batch;
  if (c.use_embeds)
    batch.inputs_embeds = random_embeds(B, S, c.hidden, c.seed);
  else
    batch.input_ids = random_ids(B, S, c.vocab, rng);
  batch.labels = random_labels(B, S, c.vocab, c.ignore_percent, rng);
  if (c.use_mask && c.edge_mask_only) {
    // Left padding [0, a) and right padding [b, S) per row; the real run may be empty.
    std::uniform_int_distribution<Eigen::Index> cut(0, S);
    batch.attention_mask = IntMatrix::Zero(B, S);
    for (Eigen::Index r = 0; r < B; ++r) {
      Eigen::Index a = cut(rng), b = cut(rng);
      if (a > b) std::swap(a, b);
      batch.attention_mask->row(r).segment(a, b - a).setOnes();
    }
  } else if (c.use_mask) {
    std::bernoulli_distribution keep(0.75);
    batch.attention_mask = IntMatrix(B, S);
    for (Eigen::Index i = 0; i < B * S; ++i) batch.attention_mask->data()[i] = keep(rng) ? 1 : 0;
  }
  if (c.use_positions) batch.position_ids = random_positions(B, S, c.increasing_positions, rng);
  batch.images.push_back({{3, 2, 2}, std::vector<float>(12, 0.5f)});
  return batch;
}

PackedBatch make_batch(const PackedCase& c) {
  std::mt19937_64 rng(input_seed(c.seed, Input::kIds));
  const auto num_rows = static_cast<Eigen::Index>(c.rows.size());
  std::size_t max_docs = 0;
  std::int64_t max_slots = 0;
  for (const auto& row : c.rows) {
    std::int64_t slots = 0;
    for (const auto& d : row) slots += d.length + d.extra;
    max_slots = std::max(max_slots, slots);
    max_docs = std::max(max_docs, row.size());
  }
  // At least one token, so a row of zero-length documents is still a valid batch.
  const Eigen::Index T = std::max<std::int64_t>(1, max_slots + c.tail);
  const auto D = static_cast<Eigen::Index>(max_docs) + c.sentinels;
  PackedBatch batch;
  if (c.use_embeds)
    batch.inputs_embeds = random_embeds(num_rows, T, c.hidden, c.seed);
  else
    batch.input_ids = random_ids(num_rows, T, c.vocab, rng);
  batch.labels = random_labels(num_rows, T, c.vocab, c.ignore_percent, rng);
  batch.seq_lens = IntMatrix::Constant(num_rows, D, kSeqLenSentinel);
  batch.seq_lens_padded = IntMatrix::Constant(num_rows, D, kSeqLenSentinel);
  for (Eigen::Index r = 0; r < num_rows; ++r)
    for (std::size_t d = 0; d < c.rows[r].size(); ++d) {
      batch.seq_lens(r, static_cast<Eigen::Index>(d)) = c.rows[r][d].length;
      batch.seq_lens_padded(r, static_cast<Eigen::Index>(d)) =
          c.rows[r][d].length + c.rows[r][d].extra;
    }
  return batch;
}

void showValue(const BshdCase& c, std::ostream& os) {
  os << "BshdCase{cp=" << c.cp << " num_chunks=" << c.num_chunks
     << " rows_per_chunk=" << c.rows_per_chunk << " S=" << c.seq_len
     << " pad_multiple=" << c.pad_multiple << " H=" << c.hidden << " V=" << c.vocab
     << " embeds=" << c.use_embeds << " mask=" << c.use_mask << " positions=" << c.use_positions
     << " edge_mask_only=" << c.edge_mask_only << " increasing=" << c.increasing_positions
     << " shard_primary=" << c.shard_primary << " pad_id=" << c.pad_token_id
     << " ignore%=" << c.ignore_percent << " logit_scale=" << c.logit_scale << " seed=" << c.seed
     << "}";
}

void showValue(const PackedCase& c, std::ostream& os) {
  os << "PackedCase{cp=" << c.cp << " pad_multiple=" << c.pad_multiple << " H=" << c.hidden
     << " V=" << c.vocab << " embeds=" << c.use_embeds << " shard_primary=" << c.shard_primary
     << " pad_id=" << c.pad_token_id << " rows=[";
  for (const auto& row : c.rows) {
    os << "[";
    for (const auto& d : row) os << d.length << "+" << d.extra << " ";
    os << "]";
  }
  os << "] tail=" << c.tail << " sentinels=" << c.sentinels << " ignore%=" << c.ignore_percent
     << " logit_scale=" << c.logit_scale << " seed=" << c.seed << " layout=" << c.layout << "}";
}

RankLossInputs cut_for_ranks(const FloatMatrix& global, const reference::Sharder& s, int m) {
  const reference::GlobalStreams& g = s.global(m);
  const auto rows = g.labels.rows();
  RankLossInputs out;
  for (int r = 0; r < s.options().cp_size; ++r) {
    const reference::LocalShard l = s.local(m, r);
    FloatMatrix mine(rows * l.layout.local_len, global.cols());
    for (Eigen::Index b = 0; b < rows; ++b)
      for (Eigen::Index j = 0; j < l.layout.local_len; ++j)  // the layout's tokens, in order
        mine.row(b * l.layout.local_len + j) =
            global.row(b * g.padded_len + l.layout.positions[static_cast<std::size_t>(j)]);
    out.values.push_back(mine);
    out.labels.push_back(l.labels);
    out.valid.push_back(l.valid);
  }
  return out;
}

std::string mismatch(const FloatMatrix& actual, const FloatMatrix& expected, double atol,
                     double rtol) {
  if (actual.rows() != expected.rows() || actual.cols() != expected.cols()) {
    std::ostringstream os;
    os << "shape [" << actual.rows() << ", " << actual.cols() << "], expected [" << expected.rows()
       << ", " << expected.cols() << "]";
    return os.str();
  }
  const auto n = static_cast<std::size_t>(actual.size());
  const auto i = first_mismatch(actual.data(), expected.data(), n, atol, rtol);
  if (!i) return {};
  return describe_mismatch(*i, actual.data()[*i], expected.data()[*i], atol, rtol);
}

}  // namespace cpkit::harness
