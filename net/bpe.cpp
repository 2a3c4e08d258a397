// BPE merge loop: repeatedly merge the adjacent pair with the lowest rank (leftmost on ties),
// with a heap so that very long pieces stay O(n log n). Results for short pieces are cached.
#include "net/bpe.hpp"

#include <algorithm>
#include <functional>

#include "net/utf8.hpp"

namespace cedar::net {

namespace {

struct byte_alphabet {
  uint32_t to_cp[256];
  int16_t from_cp[512];
  byte_alphabet() {
    for (auto& v : from_cp) v = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const byte_alphabet& alphabet() {
  static const byte_alphabet a;
  return a;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return alphabet().to_cp[b]; }

int byte_from_codepoint(uint32_t cp) { return cp < 512 ? alphabet().from_cp[cp] : -1; }

std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = utf8_sequence_length(s, pos);
    if (n == 0) return std::nullopt;
    int b = byte_from_codepoint(decode_utf8_at(s, pos, n));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    pos += n;
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_to_codepoint(b));
  return out;
}

bool bpe_model::init(const std::vector<std::pair<std::string, int32_t>>& vocab,
                     const std::vector<std::pair<std::string, std::string>>& merges, std::string* error) {
  int32_t max_id = -1;
  for (auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  token_to_id_.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    if (id < 0) {
      *error = "negative id in vocabulary";
      return false;
    }
    auto bytes = byte_level_to_bytes(tok);
    // A token outside the byte alphabet can never be produced by the merges; keep its text.
    id_bytes_[id] = bytes ? *bytes : tok;
    token_to_id_.emplace(tok, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
    auto it = token_to_id_.find(s);
    if (it == token_to_id_.end()) {
      *error = "vocabulary has no token for byte " + std::to_string(b) + " (not a byte-level BPE)";
      return false;
    }
    byte_id_[b] = it->second;
  }
  size_t capacity = 16;
  int bits = 4;
  while (capacity < 2 * merges.size()) capacity *= 2, ++bits;
  merge_slots_.assign(capacity, slot{kEmptyKey, merge{0, 0}});
  merge_mask_ = capacity - 1;
  merge_shift_ = 64 - bits;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto& [l, r] = merges[rank];
    auto li = token_to_id_.find(l), ri = token_to_id_.find(r), mi = token_to_id_.find(l + r);
    if (li == token_to_id_.end() || ri == token_to_id_.end() || mi == token_to_id_.end()) {
      *error = "merge " + std::to_string(rank) + " ('" + l + "' '" + r + "') names an unknown token";
      return false;
    }
    uint64_t key = pair_key(li->second, ri->second);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    while (merge_slots_[i].key != kEmptyKey && merge_slots_[i].key != key) i = (i + 1) & merge_mask_;
    num_merges_ += merge_slots_[i].key == kEmptyKey;
    // A repeated merge takes its last rank, as the Rust and JavaScript loaders do.
    merge_slots_[i] = slot{key, merge{static_cast<int32_t>(rank), mi->second}};
  }
  return true;
}

std::optional<int32_t> bpe_model::id_of(std::string_view byte_level) const {
  auto it = token_to_id_.find(std::string(byte_level));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void bpe_model::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    merge_loop(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out->size();
  merge_loop(piece, out);
  std::vector<int32_t> ids(out->begin() + static_cast<ptrdiff_t>(first), out->end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::move(ids));
}

void bpe_model::merge_loop(std::string_view piece, std::vector<int32_t>* out) const {
  struct candidate {
    int32_t rank, pos, left_id, right_id;
    bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  thread_local std::vector<int32_t> ids, next, prev;
  thread_local std::vector<candidate> heap;
  ids.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    ids[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const merge* m = find_merge(ids[pos], ids[next[pos]])) {
      heap.push_back(candidate{m->rank, pos, ids[pos], ids[next[pos]]});
      std::push_heap(heap.begin(), heap.end(), std::greater<candidate>());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<candidate>());
    candidate c = heap.back();
    heap.pop_back();
    int32_t r = next[c.pos];
    // Stale entry: one side was merged away or changed since it was pushed.
    if (ids[c.pos] != c.left_id || r < 0 || ids[r] != c.right_id) continue;
    ids[c.pos] = find_merge(c.left_id, c.right_id)->merged_id;
    ids[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
}

}  // namespace cedar::net
