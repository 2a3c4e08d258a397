// safetensors checkpoint I/O (spec §4.1). Reading memory-maps every file (nothing is copied:
// tensor_entry::data points into the mapping, kept alive by the tensor_map) and checks each
// header: known dtype, offsets inside the file, size = elements x dtype size, no overlaps.
// Writing streams tensors to disk shard by shard, so a checkpoint larger than memory can be
// written (the bytes of each tensor come from a fill callback, a bounded chunk at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/checkpoint/tensor_map.hpp"

namespace cedar {

/// Reads a checkpoint into `out` (tensors are added; names must not repeat). `path` may be a
/// directory holding model.safetensors.index.json (then exactly the files it names are read),
/// else model.safetensors, else every *.safetensors file in it; or one .safetensors file. On failure returns false and sets *error
/// naming the file (and the tensor when one is at fault); `out` may then hold some tensors.
bool read_safetensors(const std::string& path, tensor_map& out, std::string* error);

/// One tensor to write. fill(dst, row_begin, row_end) writes rows [row_begin, row_end) of the
/// tensor (a row = shape[0]'s unit, i.e. num_bytes / shape[0] bytes; a 0-d tensor has one
/// row) into dst, which has room for exactly those rows. May be called from several threads
/// at once for disjoint row ranges.
struct tensor_source {
  std::string name;
  st_dtype dtype = st_dtype::f32;
  std::vector<int64_t> shape;
  std::function<void(uint8_t* dst, int64_t row_begin, int64_t row_end)> fill;

  int64_t num_rows() const { return shape.empty() ? 1 : shape[0]; }
  std::size_t num_bytes() const;
};

struct safetensors_write_options {
  /// 0: one file, model.safetensors. Otherwise tensors go, in order, into shards
  /// model-0000i-of-0000n.safetensors of at most this many bytes (a larger tensor gets a shard
  /// of its own) plus model.safetensors.index.json; a single shard is named model.safetensors.
  uint64_t max_shard_bytes = 0;
  /// Threads that run fill callbacks (each chunk's rows are split among them).
  int num_threads = 1;
  /// Called after each chunk with (bytes written so far, total bytes).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

/// Writes `tensors` into directory `dir` (created if missing). Returns false and sets *error
/// naming the file on any I/O failure.
bool write_safetensors(const std::string& dir, const std::vector<tensor_source>& tensors,
                       const safetensors_write_options& options, std::string* error);

/// A tensor_source that copies an existing tensor (for writing a tensor_map back to disk).
tensor_source source_of(const std::string& name, const tensor_entry& entry);

}  // namespace cedar
