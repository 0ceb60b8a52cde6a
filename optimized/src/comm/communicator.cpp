// The Communicator interface's default members.
#include "cpkit/optimized/communicator.hpp"

#include "cpkit/optimized/error.hpp"

namespace cpkit {

void Communicator::all_to_all_v(const void*, const std::vector<std::size_t>&, void*,
                                const std::vector<std::size_t>&, ScalarKind) {
  raise("mesh", "the \"", backend(),
        "\" communicator has no all_to_all_v (point-to-point exchange), which cp_attention "
        "needs: use a Gloo, NCCL or c10d mesh");
}

std::function<void()> Communicator::start_all_to_all_v(const void* send,
                                                       const std::vector<std::size_t>& send_counts,
                                                       void* recv,
                                                       const std::vector<std::size_t>& recv_counts,
                                                       ScalarKind kind) {
  all_to_all_v(send, send_counts, recv, recv_counts, kind);
  return [] {};
}

}  // namespace cpkit
