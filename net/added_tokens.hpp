// Matching of added (special) tokens inside text: leftmost, then longest, over a byte trie.
// Built at load; find() is const and thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace cedar::net {

class added_token_matcher {
 public:
  void add(std::string_view content, int32_t id);
  void clear();

  struct match {
    size_t pos = 0;   ///< byte offset of the token in the text
    size_t size = 0;  ///< its length in bytes (0 = no match)
    int32_t id = -1;
  };
  /// The leftmost match at or after `from`, the longest one there.
  match find(std::string_view text, size_t from) const;

 private:
  struct node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t id = -1;
  };
  int32_t child(int32_t n, uint8_t b) const;
  std::vector<node> nodes_{node{}};
  bool first_byte_[256] = {};
};

}  // namespace cedar::net
