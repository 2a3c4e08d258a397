// safetensors reader: mmaps each file, parses its JSON header with simdjson and checks every
// entry before exposing it (see safetensors.hpp).
#include "kernels/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

namespace cedar {

namespace {

namespace fs = std::filesystem;
using simdjson::dom::element;

struct mapped_file {
  const uint8_t* bytes = nullptr;
  std::size_t size = 0;
};

/// Maps a whole file read-only; the returned shared_ptr unmaps it.
std::shared_ptr<void> map_file(const std::string& file, mapped_file& out, std::string& error) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) {
    error = file + ": cannot open (" + std::strerror(errno) + ")";
    return nullptr;
  }
  struct stat st {};
  ::fstat(fd, &st);
  out.size = std::size_t(st.st_size);
  if (out.size == 0) {
    ::close(fd);
    error = file + ": empty file (0 bytes): not a safetensors file";
    return nullptr;
  }
  void* p = ::mmap(nullptr, out.size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    error = file + ": mmap failed (" + std::strerror(errno) + ")";
    return nullptr;
  }
  out.bytes = static_cast<const uint8_t*>(p);
  const std::size_t size = out.size;
  return std::shared_ptr<void>(p, [size](void* q) {
    if (q) ::munmap(q, size);
  });
}

/// Parses one header entry into `t` (data relative to `data`, `data_size` bytes available).
bool parse_entry(element e, const uint8_t* data, uint64_t data_size, tensor_entry& t,
                 std::pair<uint64_t, uint64_t>& range, std::string& why) {
  std::string_view dtype;
  if (e["dtype"].get_string().get(dtype)) return why = "no dtype", false;
  if (!st_dtype_from_name(std::string(dtype), t.dtype)) return why = "unsupported dtype " + std::string(dtype), false;
  simdjson::dom::array shape, offsets;
  if (e["shape"].get_array().get(shape)) return why = "no shape", false;
  for (element d : shape) {
    int64_t v = 0;
    if (d.get_int64().get(v) || v < 0) return why = "bad shape", false;
    t.shape.push_back(v);
  }
  if (e["data_offsets"].get_array().get(offsets) || offsets.size() != 2) return why = "no data_offsets", false;
  uint64_t begin = 0, end = 0;
  if (offsets.at(0).get_uint64().get(begin) || offsets.at(1).get_uint64().get(end)) return why = "bad data_offsets", false;
  const std::string span = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end || end > data_size)
    return why = span + " lie outside the data section (" + std::to_string(data_size) + " bytes)", false;
  if (end - begin != t.num_bytes())
    return why = span + " hold " + std::to_string(end - begin) + " bytes, shape and dtype need " +
                 std::to_string(t.num_bytes()), false;
  t.data = data + begin;
  range = {begin, end};
  return true;
}

bool read_file(const std::string& file, tensor_map& out, std::string& error) {
  mapped_file m;
  std::shared_ptr<void> keep = map_file(file, m, error);
  if (!keep) return false;
  uint64_t header_len = 0;
  if (m.size < 8) return error = file + ": too short for a safetensors header", false;
  constexpr std::string_view lfs = "version https://git-lfs";
  if (std::string_view(reinterpret_cast<const char*>(m.bytes), std::min(m.size, lfs.size())) == lfs)
    return error = file + ": a Git LFS pointer, not the tensors (fetch the data, e.g. `git lfs pull`)", false;
  std::memcpy(&header_len, m.bytes, 8);
  if (header_len > m.size - 8)
    return error = file + ": header length " + std::to_string(header_len) + " exceeds the file size", false;
  simdjson::dom::parser parser;
  simdjson::padded_string header(reinterpret_cast<const char*>(m.bytes) + 8, header_len);
  simdjson::dom::object root;
  if (auto err = parser.parse(header).get(root))
    return error = file + ": bad header JSON (" + simdjson::error_message(err) + ")", false;
  const uint8_t* data = m.bytes + 8 + header_len;
  const uint64_t data_size = m.size - 8 - header_len;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> ranges;
  for (auto field : root) {
    const std::string name(field.key);
    if (name == "__metadata__") continue;
    tensor_entry t;
    std::pair<uint64_t, uint64_t> range;
    std::string why;
    if (!parse_entry(field.value, data, data_size, t, range, why))
      return error = file + ": tensor " + name + ": " + why, false;
    if (out.tensors.count(name)) return error = file + ": tensor " + name + " appears twice in the checkpoint", false;
    out.tensors.emplace(name, std::move(t));
    if (range.second > range.first) ranges.push_back({range, name});
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first.first < ranges[i - 1].first.second)
      return error = file + ": tensors " + ranges[i - 1].second + " and " + ranges[i].second + " overlap", false;
  out.keep_alive.push_back(std::move(keep));
  return true;
}

/// Reads model.safetensors.index.json: file -> the tensor names it should hold.
bool read_index(const fs::path& index, std::map<std::string, std::vector<std::string>>& files,
                std::string& error) {
  simdjson::dom::parser parser;
  simdjson::dom::object weight_map;
  simdjson::padded_string text;
  if (simdjson::padded_string::load(index.string()).get(text))
    return error = index.string() + ": cannot read", false;
  if (parser.parse(text)["weight_map"].get_object().get(weight_map))
    return error = index.string() + ": no weight_map object", false;
  for (auto field : weight_map) {
    std::string_view file;
    if (field.value.get_string().get(file))
      return error = index.string() + ": weight_map entry " + std::string(field.key) + " is not a file name", false;
    files[std::string(file)].emplace_back(field.key);
  }
  return true;
}

}  // namespace

bool read_safetensors(const std::string& path, tensor_map& out, std::string* error) {
  std::string err;
  auto fail = [&] {
    if (error) *error = err;
    return false;
  };
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) return err = path + ": no such checkpoint file or directory", fail();
    return read_file(path, out, err) || fail();
  }
  const fs::path dir(path), index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    std::map<std::string, std::vector<std::string>> files;
    if (!read_index(index, files, err)) return fail();
    for (const auto& [file, names] : files) {
      if (!read_file((dir / file).string(), out, err)) return fail();
      for (const std::string& name : names)
        if (!out.find(name))
          return err = (dir / file).string() + ": tensor " + name + " is listed in the index but missing", fail();
    }
    return true;
  }
  if (fs::exists(dir / "model.safetensors", ec)) return read_file((dir / "model.safetensors").string(), out, err) || fail();
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  if (files.empty()) return err = path + ": no .safetensors files", fail();
  std::sort(files.begin(), files.end());
  for (const std::string& file : files)
    if (!read_file(file, out, err)) return fail();
  return true;
}

}  // namespace cedar
