#include "bundle.hpp"

#include <cstring>
#include <stdexcept>

namespace cpkit::pool {

namespace {

template <class T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <class T>
T take(const std::string& in, std::size_t& at) {
  if (at + sizeof(T) > in.size()) throw std::runtime_error("bundle: truncated");
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

}  // namespace

void Bundle::add(const std::string& name, const at::Tensor& t) {
  items_.emplace_back(name, t.detach().cpu().contiguous());
}

const at::Tensor& Bundle::get(const std::string& name) const {
  for (const auto& [n, t] : items_)
    if (n == name) return t;
  throw std::runtime_error("bundle: no tensor named '" + name + "'");
}

std::string Bundle::serialise() const {
  std::string out;
  put(out, static_cast<std::uint32_t>(items_.size()));
  for (const auto& [name, t] : items_) {
    put(out, static_cast<std::uint32_t>(name.size()));
    out += name;
    put(out, static_cast<std::int32_t>(t.scalar_type()));
    put(out, static_cast<std::uint32_t>(t.dim()));
    for (int64_t d = 0; d < t.dim(); ++d) put(out, t.size(d));
    if (t.nbytes() > 0) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return out;
}

Bundle Bundle::parse(const std::string& in) {
  Bundle b;
  std::size_t at = 0;
  const auto count = take<std::uint32_t>(in, at);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto name_len = take<std::uint32_t>(in, at);
    const std::string name = in.substr(at, name_len);
    at += name_len;
    const auto type = static_cast<at::ScalarType>(take<std::int32_t>(in, at));
    const auto dims = take<std::uint32_t>(in, at);
    std::vector<int64_t> sizes;
    for (std::uint32_t d = 0; d < dims; ++d) sizes.push_back(take<int64_t>(in, at));
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(type));
    if (at + t.nbytes() > in.size()) throw std::runtime_error("bundle: truncated data");
    if (t.nbytes() > 0) std::memcpy(t.data_ptr(), in.data() + at, t.nbytes());  // empty: no data
    at += t.nbytes();
    b.items_.emplace_back(name, t);
  }
  return b;
}

}  // namespace cpkit::pool
