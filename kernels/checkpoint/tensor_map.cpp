// tensor_map and the safetensors dtype table (see tensor_map.hpp).
#include "kernels/checkpoint/tensor_map.hpp"

#include <cstring>

#include "kernels/fnv1a.hpp"

namespace cedar {

namespace {
struct dtype_row {
  st_dtype dtype;
  const char* name;
  std::size_t size;
};
constexpr dtype_row dtype_table[] = {
    {st_dtype::f32, "F32", 4},         {st_dtype::bf16, "BF16", 2},  {st_dtype::f16, "F16", 2},
    {st_dtype::f8_e4m3, "F8_E4M3", 1}, {st_dtype::f8_e8m0, "F8_E8M0", 1},
    {st_dtype::i8, "I8", 1},           {st_dtype::u8, "U8", 1},      {st_dtype::i32, "I32", 4},
    {st_dtype::i64, "I64", 8},
};
}  // namespace

const char* st_dtype_name(st_dtype t) {
  for (const dtype_row& r : dtype_table)
    if (r.dtype == t) return r.name;
  return "?";
}

bool st_dtype_from_name(const std::string& name, st_dtype& out) {
  for (const dtype_row& r : dtype_table)
    if (name == r.name) {
      out = r.dtype;
      return true;
    }
  return false;
}

std::size_t st_dtype_size(st_dtype t) {
  for (const dtype_row& r : dtype_table)
    if (r.dtype == t) return r.size;
  return 0;
}

int64_t tensor_entry::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::size_t tensor_entry::num_bytes() const { return std::size_t(num_elements()) * st_dtype_size(dtype); }

const tensor_entry* tensor_map::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

std::string tensor_map::digest() const {
  fnv1a h;
  constexpr std::size_t samples = 16, width = 16;
  for (const auto& [name, t] : tensors) {
    h.add(name.data(), name.size());
    const auto dtype = uint8_t(t.dtype);
    h.add(&dtype, 1);
    for (int64_t d : t.shape) h.add(&d, sizeof d);
    const std::size_t n = t.num_bytes();
    if (!t.data || n == 0) continue;
    if (n <= samples * width) {
      h.add(t.data, n);
      continue;
    }
    for (std::size_t i = 0; i < samples; ++i) h.add(t.data + (n - width) * i / (samples - 1), width);
  }
  return h.hex();
}

uint8_t* tensor_map::add_owned(const std::string& name, st_dtype dtype, std::vector<int64_t> shape) {
  tensor_entry e;
  e.dtype = dtype;
  e.shape = std::move(shape);
  const std::size_t n = e.num_bytes();
  // new[]() value-initializes: the tensor starts zero-filled.
  std::shared_ptr<uint8_t[]> buf(new uint8_t[n ? n : 1]());
  e.data = buf.get();
  keep_alive.push_back(std::shared_ptr<void>(buf, buf.get()));
  uint8_t* data = buf.get();
  tensors[name] = std::move(e);
  return data;
}

}  // namespace cedar
