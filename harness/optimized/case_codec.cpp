#include "case_codec.hpp"

#include <sstream>

namespace cpkit::harness {

std::string encode(const BshdCase& c) {
  std::ostringstream os;
  os << c.cp << " " << c.num_chunks << " " << c.rows_per_chunk << " " << c.seq_len << " "
     << c.pad_multiple << " " << c.hidden << " " << c.vocab << " " << c.use_embeds << " "
     << c.use_mask << " " << c.use_positions << " " << c.shard_primary << " " << c.pad_token_id
     << " " << c.ignore_percent << " " << c.logit_scale << " " << c.seed << " " << c.edge_mask_only
     << " " << c.increasing_positions << " " << c.layout;
  return os.str();
}

BshdCase decode_bshd(const std::string& text) {
  std::istringstream in(text);
  BshdCase c;
  in >> c.cp >> c.num_chunks >> c.rows_per_chunk >> c.seq_len >> c.pad_multiple >> c.hidden >>
      c.vocab >> c.use_embeds >> c.use_mask >> c.use_positions >> c.shard_primary >>
      c.pad_token_id >> c.ignore_percent >> c.logit_scale >> c.seed >> c.edge_mask_only >>
      c.increasing_positions >> c.layout;
  return c;
}

std::string encode(const PackedCase& c) {
  std::ostringstream os;
  os << c.cp << " " << c.pad_multiple << " " << c.hidden << " " << c.vocab << " " << c.use_embeds
     << " " << c.shard_primary << " " << c.pad_token_id << " " << c.tail << " " << c.sentinels
     << " " << c.ignore_percent << " " << c.logit_scale << " " << c.seed << " " << c.layout << " "
     << c.rows.size();
  for (const auto& row : c.rows) {
    os << " " << row.size();
    for (const auto& d : row) os << " " << d.length << " " << d.extra;
  }
  return os.str();
}

PackedCase decode_packed(const std::string& text) {
  std::istringstream in(text);
  PackedCase c;
  std::size_t rows = 0;
  in >> c.cp >> c.pad_multiple >> c.hidden >> c.vocab >> c.use_embeds >> c.shard_primary >>
      c.pad_token_id >> c.tail >> c.sentinels >> c.ignore_percent >> c.logit_scale >> c.seed >>
      c.layout >> rows;
  c.rows.resize(rows);
  for (auto& row : c.rows) {
    std::size_t docs = 0;
    in >> docs;
    row.resize(docs);
    for (auto& d : row) in >> d.length >> d.extra;
  }
  return c;
}

}  // namespace cpkit::harness
