// Names of the rank-process tasks and their payload helpers (shared by tasks.cpp and the
// properties that send them).
#pragma once

#include <sstream>
#include <string>

namespace cpkit::harness {

// Shard a case with the optimized Sharder; reply: every rank's streams, gathered streams.
inline const std::string kShardBshd = "shard_bshd";
inline const std::string kShardPacked = "shard_packed";
// Shifted loss and its gradient for every microbatch of a case. Payload: softcap then case.
inline const std::string kLossBshd = "loss_bshd";
inline const std::string kLossPacked = "loss_packed";
// gather_tokens forward/backward with rank-weighted upstream. Payload: tokens features seed.
inline const std::string kGather = "gather";
// Masked CP attention through gather_tokens. Payload: head then packed case (one row).
inline const std::string kAttention = "attention";
// gather_tokens with a rank-dependent token count (must raise on every rank).
inline const std::string kGatherMismatch = "gather_mismatch";

// "first rest": splits a payload at its first space.
inline std::pair<std::string, std::string> split_first(const std::string& payload) {
  const auto space = payload.find(' ');
  return {payload.substr(0, space), space == std::string::npos ? "" : payload.substr(space + 1)};
}

}  // namespace cpkit::harness
