// Keys for values that meshes exchange through a c10d Store.
#include <string>

#include "comm/store_meshes.hpp"

namespace cpkit::detail {

std::string next_mesh_key(c10d::Store& store, const std::string& what, int rank) {
  const int64_t n = store.add("cpkit_" + what + "_meshes_of_rank_" + std::to_string(rank), 1);
  return "cpkit_" + what + "_" + std::to_string(n);
}

}  // namespace cpkit::detail
