// CP meshes for the Python ops: a process group's name (as PyTorch's functional collectives
// pass it) resolved through c10d's group registry into a mesh over its backend for a device.
#pragma once

#include <ATen/Device.h>

#include <string>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::python {

// "" means CP = 1 (nullptr: no communication).
MeshPtr mesh_for(const std::string& group_name, const at::Device& device);

}  // namespace cpkit::python
