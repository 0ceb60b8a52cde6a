// Agreement across the CP group (internal header, docs/spec.md section 3 "Ranks that
// disagree"): every rank publishes the values that must be equal on all ranks in one
// all-gather that the operation needs anyway, and every rank compares the same table, so a
// disagreement raises on every rank at once, naming the argument, both ranks and both values,
// instead of a hang or a silently wrong result. The collective always completes first, so the
// group stays usable after the error.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::detail {

// One value every rank must agree on. `describe` (optional) prints a value, e.g. a dtype.
struct Agreed {
  const char* argument;
  const char* what;  // "the dtype", "the local length L", ...
  std::int64_t value;
  std::string (*describe)(std::int64_t) = nullptr;
};

// Gathers `carried` (k int64 values, on the exchange's device, not checked: e.g. a count that
// the caller sums) followed by `fields` from every rank: a [CP, k + fields] int64 table on
// `carried`'s device. When `read` is true the table is copied to the host and compared;
// `why` ends the error message.
at::Tensor exchange_agreed(const at::Tensor& carried, const std::vector<Agreed>& fields,
                           Communicator& comm, bool read, const char* why);

// The one rule for when the agreement table is read on the host: always for CPU tensors (the
// table is already there) and for tensors whose values are checked
// (cpkit/optimized/validation.hpp), else the first time this mesh sees `key` (for CUDA
// tensors each read is a host round trip). The exchange itself is never skipped: a rank that
// skipped it on its own history while a peer whose shape changed entered it would leave the
// two in different collectives (a size mismatch abort under Gloo, a hang under NCCL).
bool agreement_needs_reading(const at::Tensor& t, const MeshPtr& mesh,
                             std::vector<std::int64_t> key);

// A dtype as a table value and back to its name.
std::int64_t dtype_code(const at::Tensor& t);
std::string dtype_name(std::int64_t code);

// A checksum of a tensor's integer values: their sum weighted by odd, position-dependent
// multipliers ((2 i + 1) * 0x9E3779B97F4A7C15), modulo 2^64, so that changing any one value
// always changes it. Computed on the tensor's device; a 0-d int64 tensor. CPU: one pass;
// other devices: value_checksum_ops, the same sum in tensor ops (tested equal on the CPU).
at::Tensor value_checksum(const at::Tensor& t);
at::Tensor value_checksum_ops(const at::Tensor& t);

}  // namespace cpkit::detail
