// A set of named tensors in checkpoint formats (spec §4): what a safetensors reader returns,
// what the random-checkpoint generator produces, and what the model binds its weights from.
// Bytes are either memory-mapped from files (kept alive by `keep_alive`) or owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cedar {

/// safetensors dtypes used by V4.1 checkpoints ("I8" holds packed FP4 E2M1 pairs).
enum class st_dtype : uint8_t { f32, bf16, f16, f8_e4m3, f8_e8m0, i8, u8, i32, i64 };

const char* st_dtype_name(st_dtype t);         ///< "F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", ...
bool st_dtype_from_name(const std::string& name, st_dtype& out);
std::size_t st_dtype_size(st_dtype t);         ///< bytes per element

struct tensor_entry {
  st_dtype dtype = st_dtype::f32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  ///< row-major, size = num_bytes()
  std::size_t num_bytes() const;
  int64_t num_elements() const;
};

/// Name -> tensor. Owns (or keeps alive) every byte its entries point to.
struct tensor_map {
  std::map<std::string, tensor_entry> tensors;
  std::vector<std::shared_ptr<void>> keep_alive;  ///< mmaps and owned buffers

  const tensor_entry* find(const std::string& name) const;
  /// Adds an owned, zero-filled tensor and returns its writable bytes.
  uint8_t* add_owned(const std::string& name, st_dtype dtype, std::vector<int64_t> shape);
  /// 16 hex digits over every tensor's name, dtype and shape and 16 evenly spaced 16-byte
  /// samples of its data (first and last bytes included): two processes holding different
  /// weights (another seed, another revision) tell each other apart without reading them all.
  std::string digest() const;
};

}  // namespace cedar
