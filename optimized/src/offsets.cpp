// attention_offsets: group each global row into attention documents (host metadata, as the
// sharder reads it), then cut the rank's tokens into fragments, each attending from its
// document's first token to its own last.
#include "cpkit/optimized/offsets.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cuda_glue.hpp"
#include "kernels/packed_layout.hpp"
#include "sharder_internal.hpp"

namespace cpkit {

namespace {

// The per-token metadata of one global row, on the host.
struct RowMeta {
  std::vector<std::int64_t> document, position;
  std::vector<bool> padding;
};

RowMeta packed_row(const Sharder::Microbatch& mb, std::int64_t padded_len) {
  RowMeta row;
  kernels::PackedWalk walk(0, mb.cu_padded.data_ptr<int64_t>(), mb.lens.data_ptr<int64_t>(),
                           mb.lens.numel());
  for (std::int64_t t = 0; t < padded_len; ++t) {
    const kernels::PackedToken tok = walk.at(t);
    row.document.push_back(tok.document);
    row.position.push_back(tok.position);
    row.padding.push_back(tok.padding);
  }
  return row;
}

// BSHD: the row is one document over [0, S); padding past S or where the mask is 0.
RowMeta bshd_row(const CPBatch& batch, std::int64_t row_index, std::int64_t S,
                 std::int64_t padded_len) {
  RowMeta row;
  const at::Tensor mask = batch.attention_mask.defined()
                              ? batch.attention_mask[row_index].to(at::kCPU, at::kLong).contiguous()
                              : at::Tensor();
  const at::Tensor positions = batch.position_ids.defined()
                                   ? batch.position_ids[row_index].to(at::kCPU).contiguous()
                                   : at::Tensor();
  for (std::int64_t t = 0; t < padded_len; ++t) {
    const bool past = t >= S;
    row.document.push_back(past ? 0 : 1);
    row.padding.push_back(past || (mask.defined() && mask.data_ptr<int64_t>()[t] == 0));
    // Only real tokens' positions matter here (they are all before S).
    row.position.push_back(past ? 0 : positions.defined() ? positions.data_ptr<int64_t>()[t] : t);
  }
  return row;
}

// For every token: the global index where its attention document starts. A document is a
// run of one document id; padding before the document's first real token is a document of
// its own (BSHD left padding). Real tokens must be contiguous within a document and their
// positions increasing, or no varlen offsets express the mask.
std::vector<std::int64_t> document_starts(const RowMeta& row, std::int64_t b) {
  const auto T = static_cast<std::int64_t>(row.document.size());
  std::vector<std::int64_t> start(static_cast<std::size_t>(T));
  std::int64_t current = 0, last_real = -1;
  bool padding_after_real = false;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool pad = row.padding[t];
    const bool new_document = t == 0 || row.document[t] != row.document[t - 1];
    const bool real_after_left_padding =
        !new_document && !pad && last_real < current && row.padding[t - 1];
    if (new_document || real_after_left_padding) {
      current = t;
      padding_after_real = false;
    }
    if (pad && last_real >= current) padding_after_real = true;
    if (!pad) {
      if (padding_after_real)
        raise("attention_mask", "row ", b, " has padding at ", t - 1,
              " between real tokens: varlen offsets need left or right padding only");
      if (last_real >= current && row.position[t] <= row.position[last_real])
        raise("position_ids", "row ", b, " position ", row.position[t], " at ", t,
              " does not follow ", row.position[last_real], " at ", last_real,
              ": varlen attention is causal by token order, positions must increase");
      last_real = t;
    }
    start[static_cast<std::size_t>(t)] = current;
  }
  return start;
}

// int32 offsets on `device`.
at::Tensor to_device(const std::vector<std::int64_t>& values, const at::Device& device) {
  return detail::upload(at::tensor(values, at::kLong).to(at::kInt), device, "attention offsets");
}

}  // namespace

AttentionOffsets attention_offsets(const Sharder& sharder, int microbatch, int rank) {
  const Layout l = sharder.layout(microbatch, rank);
  const Sharder::Microbatch& mb = sharder.microbatch(microbatch);
  const CPBatch& batch = sharder.batch_;
  std::vector<std::vector<std::int64_t>> starts;
  for (std::int64_t b = 0; b < mb.rows; ++b) {
    const RowMeta row = mb.packed ? packed_row(mb, l.padded_len)
                                  : bshd_row(batch, mb.first_row + b, l.seq_len, l.padded_len);
    starts.push_back(document_starts(row, mb.first_row + b));
  }

  AttentionOffsets out;
  std::vector<std::int64_t> q{0}, k{0};
  auto add = [&](std::int64_t q_len, std::int64_t k_len) {
    q.push_back(q.back() + q_len);
    k.push_back(k.back() + k_len);
    out.max_seqlen_q = std::max(out.max_seqlen_q, q_len);
    out.max_seqlen_k = std::max(out.max_seqlen_k, k_len);
  };
  const at::Device device = batch.labels.device();
  if (l.plan->kind == LayoutKind::kContiguous) {
    // Keys: one slice [k_begin, end) of every gathered row (rank order = global order).
    const std::int64_t begin = l.fragments.front().begin, end = l.fragments.front().end;
    out.k_end = end;
    out.k_begin = end;
    for (const auto& s : starts) out.k_begin = std::min(out.k_begin, s[begin]);
    for (const auto& s : starts) {
      std::int64_t key = out.k_begin;  // the next key of this row's slice not yet covered
      for (std::int64_t t = begin; t < end;) {
        std::int64_t u = t + 1;
        while (u < end && s[u] == s[t]) ++u;
        // Keys this row's slice skips before the fragment's document: a segment, no query.
        if (s[t] > key) add(0, s[t] - key);
        add(u - t, u - s[t]);
        key = u;
        t = u;
      }
    }
  } else {
    // Each piece of a fragment inside one attention document is a segment; its keys, the
    // document from its start to the piece's end, are gathered rows picked by k_index
    // (repeated when the document has several pieces on this rank).
    const LayoutPlan& plan = *l.plan;
    const std::int64_t L = plan.local_len, width = plan.cp_size * L;
    const std::vector<std::int64_t> gathered_at = restore_index(plan);
    std::vector<std::int64_t> keys;
    for (std::size_t b = 0; b < starts.size(); ++b) {
      const auto& s = starts[b];
      for (const Fragment& f : l.fragments)
        for (std::int64_t t = f.begin; t < f.end;) {
          std::int64_t u = t + 1;
          while (u < f.end && s[u] == s[t]) ++u;
          for (std::int64_t key = s[t]; key < u; ++key)
            keys.push_back(static_cast<std::int64_t>(b) * width +
                           gathered_at[static_cast<std::size_t>(key)]);
          add(u - t, u - s[t]);
          t = u;
        }
    }
    out.k_index = detail::upload(at::tensor(keys, at::kLong), device, "attention offsets");
  }
  out.cu_seqlens_q = to_device(q, device);
  out.cu_seqlens_k = to_device(k, device);
  return out;
}

}  // namespace cpkit
