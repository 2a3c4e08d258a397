// Byte trie over the added-token table (net/added_tokens.hpp).
#include "net/added_tokens.hpp"

#include <algorithm>
#include <cstring>

namespace cedar::net {

int32_t added_token_matcher::child(int32_t n, uint8_t b) const {
  const auto& v = nodes_[n].next;
  auto it = std::lower_bound(v.begin(), v.end(), b, [](const auto& e, uint8_t x) { return e.first < x; });
  return it != v.end() && it->first == b ? it->second : -1;
}

void added_token_matcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  int32_t n = 0;
  for (unsigned char b : content) {
    int32_t c = child(n, b);
    if (c < 0) {
      c = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(node{});
      auto& v = nodes_[n].next;
      auto it = std::lower_bound(v.begin(), v.end(), b, [](const auto& e, uint8_t x) { return e.first < x; });
      v.insert(it, {b, c});
    }
    n = c;
  }
  nodes_[n].id = id;
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

void added_token_matcher::clear() {
  nodes_.assign(1, node{});
  std::memset(first_byte_, 0, sizeof first_byte_);
}

added_token_matcher::match added_token_matcher::find(std::string_view text, size_t from) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    match best;
    int32_t n = 0;
    for (size_t j = i; j < text.size(); ++j) {
      n = child(n, static_cast<unsigned char>(text[j]));
      if (n < 0) break;
      if (nodes_[n].id >= 0) best = match{i, j + 1 - i, nodes_[n].id};
    }
    if (best.size) return best;
  }
  return match{text.size(), 0, -1};
}

}  // namespace cedar::net
