// Keeps a mesh alive inside an autograd context (saved_data holds IValues only).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/custom_class_detail.h>

#include "cpkit/optimized/communicator.hpp"

namespace cpkit::detail {

struct MeshHolder : torch::CustomClassHolder {
  explicit MeshHolder(MeshPtr m) : mesh(std::move(m)) {}
  MeshPtr mesh;
};

inline c10::IValue mesh_capsule(MeshPtr mesh) {
  return c10::IValue::make_capsule(c10::make_intrusive<MeshHolder>(std::move(mesh)));
}

inline MeshPtr mesh_from_capsule(const c10::IValue& value) {
  return c10::static_intrusive_pointer_cast<MeshHolder>(value.toCapsule())->mesh;
}

}  // namespace cpkit::detail
