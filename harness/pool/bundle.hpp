// A named list of tensors as bytes: how rank processes send results to the harness.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace cpkit::pool {

class Bundle {
 public:
  void add(const std::string& name, const at::Tensor& t);
  const at::Tensor& get(const std::string& name) const;  // throws if absent

  std::string serialise() const;
  static Bundle parse(const std::string& bytes);

 private:
  std::vector<std::pair<std::string, at::Tensor>> items_;
};

}  // namespace cpkit::pool
