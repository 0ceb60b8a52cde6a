// libFuzzer target over the batch-metadata validation and the packed-layout planner.
// Bytes become a packed row's seq_lens / seq_lens_padded, T, CP and pad_multiple. The
// reference must either reject them with cpkit::reference::Error, or accept them; then the
// optimized path's packed_token kernel body (a different algorithm: binary search over slot
// offsets) and its host walk (PackedWalk, from token 0 and from a fuzzed start) must agree
// with the reference on every token. Any other outcome traps.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpkit/reference/reference.hpp"
#include "kernels/packed_layout.hpp"

namespace {

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::uint8_t next() {
    if (size == 0) return 0;
    --size;
    return *data++;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace cpkit::reference;
  Reader in{data, size};
  const int T = 1 + in.next() % 64;
  const int cp = 1 + in.next() % 8;
  const int pad_multiple = 1 + in.next() % 3;
  const int D = 1 + in.next() % 6;
  const int walk_start = in.next();
  PackedBatch batch;
  batch.input_ids = IntMatrix::Ones(1, T);
  batch.labels = IntMatrix::Ones(1, T);
  batch.seq_lens.resize(1, D);
  batch.seq_lens_padded.resize(1, D);
  for (int d = 0; d < D; ++d) {
    // 0xFF is the sentinel; other values span [-2, 40].
    const auto a = in.next(), b = in.next();
    batch.seq_lens(0, d) = a == 0xFF ? kSeqLenSentinel : static_cast<std::int64_t>(a % 43) - 2;
    batch.seq_lens_padded(0, d) =
        b == 0xFF ? kSeqLenSentinel : static_cast<std::int64_t>(b % 43) - 2;
  }
  try {
    const Sharder s =
        prepare_packed_cp_inputs(batch, {.cp_size = cp, .pad_multiple = pad_multiple});
    const GlobalStreams& g = s.global(0);
    std::vector<std::int64_t> lens;
    for (int d = 0; d < D; ++d)
      if (batch.seq_lens(0, d) != kSeqLenSentinel) lens.push_back(batch.seq_lens(0, d));
    // CP = 1 is the identity on layout; otherwise the next multiple of CP * pad_multiple.
    const bool padded_ok = cp == 1 ? g.padded_len == T
                                   : g.padded_len % (cp * pad_multiple) == 0 && g.padded_len >= T &&
                                         g.padded_len - T < cp * pad_multiple;
    if (!padded_ok) __builtin_trap();
    const auto docs = static_cast<std::int64_t>(lens.size());
    const auto agrees = [&](const cpkit::kernels::PackedToken& tok, std::int64_t t) {
      return tok.document == g.document_ids(0, t) && tok.position == g.position_ids(0, t) &&
             tok.padding == g.padding(0, t);
    };
    const std::int64_t start = walk_start % g.padded_len;
    cpkit::kernels::PackedWalk from_zero(0, g.cu_seqlens_padded.data(), lens.data(), docs);
    cpkit::kernels::PackedWalk from_start(start, g.cu_seqlens_padded.data(), lens.data(), docs);
    for (std::int64_t t = 0; t < g.padded_len; ++t) {
      if (!agrees(cpkit::kernels::packed_token(t, g.cu_seqlens_padded.data(), lens.data(), docs),
                  t) ||
          !agrees(from_zero.at(t), t) || (t >= start && !agrees(from_start.at(t), t)))
        __builtin_trap();
    }
  } catch (const Error&) {
    // rejected with the one error type: fine
  }
  return 0;
}
