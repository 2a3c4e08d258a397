// safetensors writer: plans shards, writes each file's header, then streams every tensor in
// chunks of at most chunk_bytes, filling each chunk with several threads while the previous
// chunk is written (see safetensors.hpp).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>

#include "kernels/checkpoint/safetensors.hpp"

namespace cedar {

namespace {

namespace fs = std::filesystem;
constexpr std::size_t chunk_bytes = std::size_t(64) << 20;

struct shard_plan {
  std::string file;
  std::vector<const tensor_source*> tensors;
  uint64_t data_bytes = 0;
};

std::vector<shard_plan> plan_shards(const std::vector<tensor_source>& tensors, uint64_t max_bytes) {
  std::vector<shard_plan> shards(1);
  for (const tensor_source& t : tensors) {
    shard_plan* s = &shards.back();
    if (max_bytes && !s->tensors.empty() && s->data_bytes + t.num_bytes() > max_bytes) {
      shards.emplace_back();
      s = &shards.back();
    }
    s->tensors.push_back(&t);
    s->data_bytes += t.num_bytes();
  }
  const std::size_t n = shards.size();
  char name[64];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    shards[i].file = n == 1 ? "model.safetensors" : name;
  }
  return shards;
}

/// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string header_json(const shard_plan& shard) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  for (const tensor_source* t : shard.tensors) {
    h += ",\"" + t->name + "\":{\"dtype\":\"" + st_dtype_name(t->dtype) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t->shape.size(); ++i) h += (i ? "," : "") + std::to_string(t->shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t->num_bytes()) + "]}";
    offset += t->num_bytes();
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

/// Fills rows [begin, end) of t into dst, split over num_threads threads.
void fill_parallel(const tensor_source& t, uint8_t* dst, int64_t begin, int64_t end,
                   std::size_t row_bytes, int num_threads) {
  const int64_t rows = end - begin;
  const int n = int(std::clamp<int64_t>(rows, 1, std::max(1, num_threads)));
  if (n == 1 || rows * int64_t(row_bytes) < (int64_t(1) << 20)) return t.fill(dst, begin, end);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    const int64_t lo = begin + rows * i / n, hi = begin + rows * (i + 1) / n;
    threads.emplace_back([&t, dst, lo, hi, begin, row_bytes] { t.fill(dst + (lo - begin) * row_bytes, lo, hi); });
  }
  for (std::thread& th : threads) th.join();
}

bool write_shard(const fs::path& dir, const shard_plan& shard, const safetensors_write_options& opt,
                 uint64_t& done, uint64_t total, std::string& error) {
  const std::string path = (dir / shard.file).string();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return error = path + ": cannot create (" + std::strerror(errno) + ")", false;
  const std::string header = header_json(shard);
  const uint64_t header_len = header.size();
  bool ok = std::fwrite(&header_len, 8, 1, f.get()) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  // Double buffering: chunk k+1 is filled while chunk k is written.
  std::vector<uint8_t> bufs[2];
  std::future<bool> pending;
  int64_t chunk_idx = 0;
  for (const tensor_source* t : shard.tensors) {
    const int64_t rows = t->num_rows();
    const std::size_t row_bytes = rows ? t->num_bytes() / rows : 0;
    const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(chunk_bytes / std::max<std::size_t>(row_bytes, 1)));
    for (int64_t r = 0; ok && r < rows; r += rows_per_chunk) {
      const int64_t r_end = std::min(rows, r + rows_per_chunk);
      std::vector<uint8_t>& buf = bufs[chunk_idx++ & 1];
      buf.resize(std::size_t(r_end - r) * row_bytes);  // every byte is then filled
      fill_parallel(*t, buf.data(), r, r_end, row_bytes, opt.num_threads);
      if (pending.valid()) ok = pending.get();
      pending = std::async(std::launch::async, [&buf, file = f.get()] {
        return std::fwrite(buf.data(), 1, buf.size(), file) == buf.size();
      });
      done += buf.size();
      if (opt.progress) opt.progress(done, total);
    }
  }
  if (pending.valid()) ok = pending.get() && ok;
  if (!ok || std::fflush(f.get()) != 0) return error = path + ": write failed (" + std::strerror(errno) + ")", false;
  return true;
}

bool write_index(const fs::path& dir, const std::vector<shard_plan>& shards, uint64_t total, std::string& error) {
  std::string text = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) + "},\n  \"weight_map\": {";
  bool first = true;
  for (const shard_plan& s : shards)
    for (const tensor_source* t : s.tensors) {
      text += std::string(first ? "\n" : ",\n") + "    \"" + t->name + "\": \"" + s.file + "\"";
      first = false;
    }
  text += "\n  }\n}\n";
  const std::string path = (dir / "model.safetensors.index.json").string();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f || std::fwrite(text.data(), 1, text.size(), f.get()) != text.size())
    return error = path + ": write failed", false;
  return true;
}

}  // namespace

std::size_t tensor_source::num_bytes() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return std::size_t(n) * st_dtype_size(dtype);
}

tensor_source source_of(const std::string& name, const tensor_entry& entry) {
  const std::size_t row_bytes = entry.shape.empty() || entry.shape[0] == 0 ? entry.num_bytes()
                                                                           : entry.num_bytes() / entry.shape[0];
  const uint8_t* data = entry.data;
  return tensor_source{name, entry.dtype, entry.shape, [data, row_bytes](uint8_t* dst, int64_t lo, int64_t hi) {
                         std::memcpy(dst, data + lo * row_bytes, std::size_t(hi - lo) * row_bytes);
                       }};
}

bool write_safetensors(const std::string& dir, const std::vector<tensor_source>& tensors,
                       const safetensors_write_options& options, std::string* error) {
  std::string err;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) {
    if (error) *error = dir + ": cannot create directory";
    return false;
  }
  const std::vector<shard_plan> shards = plan_shards(tensors, options.max_shard_bytes);
  uint64_t total = 0, done = 0;
  for (const shard_plan& s : shards) total += s.data_bytes;
  bool ok = true;
  for (const shard_plan& s : shards)
    if (ok) ok = write_shard(dir, s, options, done, total, err);
  if (ok && shards.size() > 1) ok = write_index(dir, shards, total, err);
  // Leave no file of an earlier layout behind for the reader to pick up.
  if (ok && shards.size() == 1) fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
  if (ok && shards.size() > 1) fs::remove(fs::path(dir) / "model.safetensors", ec);
  if (!ok && error) *error = err;
  return ok;
}

}  // namespace cedar
