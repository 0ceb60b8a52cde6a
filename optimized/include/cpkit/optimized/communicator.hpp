// The collective engine behind a CP mesh, on raw buffers like NCCL: no LibTorch types, so
// NCCL, Gloo and c10d adapters all fit behind it. Buffers live on the engine's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cpkit {

enum class ScalarKind : std::uint8_t { kFloat32, kFloat16, kBFloat16, kInt64, kUInt8, kFloat64 };

// Bytes per element of a kind (what a Communicator that stages or copies buffers moves).
constexpr std::size_t scalar_bytes(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kInt64:
    case ScalarKind::kFloat64:
      return 8;
    case ScalarKind::kFloat32:
      return 4;
    case ScalarKind::kFloat16:
    case ScalarKind::kBFloat16:
      return 2;
    case ScalarKind::kUInt8:
      return 1;
  }
  return 1;
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  // The collective group this mesh speaks for, when meshes are rebuilt around one group (the
  // Python ops build one per call): state kept per mesh, such as the shapes gather_tokens has
  // checked, is then kept per group. Group names are created in the same order on every
  // rank, so all ranks agree on them. "" (the default): this mesh object alone.
  virtual std::string group_name() const { return ""; }

  // recv holds size() * count elements: rank 0's `count` first.
  virtual void all_gather(const void* send, void* recv, std::size_t count, ScalarKind kind) = 0;
  // send holds size() * count elements; recv (count) gets the sum over ranks of slice rank().
  virtual void reduce_scatter_sum(const void* send, void* recv, std::size_t count,
                                  ScalarKind kind) = 0;
  virtual void all_reduce_sum(void* data, std::size_t count, ScalarKind kind) = 0;
  // Neighbour exchange for the loss halo: rank r sends `send` to r - 1 and receives rank
  // r + 1's into `recv`. The last rank's recv is left untouched; rank 0 sends nothing.
  virtual void shift_from_next(const void* send, void* recv, std::size_t count,
                               ScalarKind kind) = 0;
  // Personalised exchange (cp_attention's needed keys): `send` holds send_counts[q] elements
  // for each rank q in rank order (its own slice too, copied locally); `recv` gets
  // recv_counts[q] elements from each rank q in rank order. recv_counts[q] must equal rank
  // q's send_counts[rank()] (callers derive both from one plan). The default raises: a
  // communicator that cannot move point to point does not serve cp_attention.
  virtual void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts,
                            void* recv, const std::vector<std::size_t>& recv_counts,
                            ScalarKind kind);
  // all_to_all_v started now and finished by the returned call, which raises as
  // all_to_all_v would; both buffers must outlive it. Work done in between overlaps the
  // transfer (cp_attention's first stage). The default exchanges at once (no overlap).
  virtual std::function<void()> start_all_to_all_v(const void* send,
                                                   const std::vector<std::size_t>& send_counts,
                                                   void* recv,
                                                   const std::vector<std::size_t>& recv_counts,
                                                   ScalarKind kind);
};

// A CP mesh is a shared communicator; nullptr (or size 1) means CP = 1: no communication.
using MeshPtr = std::shared_ptr<Communicator>;

inline int cp_size(const MeshPtr& mesh) { return mesh ? mesh->size() : 1; }
inline int cp_rank(const MeshPtr& mesh) { return mesh ? mesh->rank() : 0; }

}  // namespace cpkit
