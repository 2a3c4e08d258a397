// Byte-level BPE: the vocabulary, the merge ranks and the merge loop of a tokenizer.json
// "model" of type BPE. The ByteLevel byte->character alphabet is applied at load time, so
// encoding works on raw bytes and ids. Read-only after load, except the piece cache (locked).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cedar::net {

/// The GPT-2 byte-level alphabet: byte b <-> one printable code point.
uint32_t byte_to_codepoint(uint8_t b);
/// Inverse of byte_to_codepoint; -1 for code points outside the alphabet.
int byte_from_codepoint(uint32_t cp);
/// The byte-level form of raw bytes (what tokenizer.json's vocabulary keys look like).
std::string bytes_to_byte_level(std::string_view bytes);
/// Inverse of bytes_to_byte_level; nullopt if a character is outside the alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view s);

class bpe_model {
 public:
  /// vocab: (byte-level token string, id) pairs; merges: (left, right) byte-level strings in
  /// rank order. Fails if a byte has no token or a merge names an unknown token.
  bool init(const std::vector<std::pair<std::string, int32_t>>& vocab,
            const std::vector<std::pair<std::string, std::string>>& merges, std::string* error);

  /// Appends the ids of one pre-tokenized piece (raw bytes) to *out.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

  /// Raw bytes of a vocabulary id (empty if unknown).
  std::string_view bytes_of(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_bytes_.size() ? std::string_view(id_bytes_[id]) : std::string_view();
  }
  /// Id of a byte-level vocabulary string.
  std::optional<int32_t> id_of(std::string_view byte_level) const;
  /// One past the largest vocabulary id.
  int32_t size() const { return static_cast<int32_t>(id_bytes_.size()); }
  size_t num_merges() const { return num_merges_; }

 private:
  struct merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_loop(std::string_view piece, std::vector<int32_t>* out) const;
  /// The merge of (a, b), or nullptr: an open-addressing table (the hot lookup of encode).
  const merge* find_merge(int32_t a, int32_t b) const {
    uint64_t key = pair_key(a, b);
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;; i = (i + 1) & merge_mask_) {
      const slot& s = merge_slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmptyKey) return nullptr;
    }
  }

  int32_t byte_id_[256] = {};
  std::vector<std::string> id_bytes_;                      // [vocab size] raw bytes
  std::unordered_map<std::string, int32_t> token_to_id_;  // byte-level string -> id
  struct slot {
    uint64_t key;  // pair_key(left id, right id), or kEmptyKey
    merge value;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};
  std::vector<slot> merge_slots_;  // power-of-two size, at most half full
  size_t merge_mask_ = 0;
  int merge_shift_ = 64;
  size_t num_merges_ = 0;

  static constexpr size_t kMaxCachedPieceBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace cedar::net
