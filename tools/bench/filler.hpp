// Filler prompt text for trace replay: each 64-token hash block id maps deterministically to a
// block of 64 common English words (about 64 tokens for a typical BPE vocabulary), so prompts that
// share hash ids share text and a server's prefix cache hits as it would on the real prompts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cedar::bench {

constexpr int kWordsPerBlock = 64;

/// Appends the block of hash id `id` in namespace `scope` (ids mean nothing across traces).
void append_block(std::string& out, uint64_t scope, int64_t id);

/// Appends `num_words` words drawn from `seed` (partial blocks, replies, padding).
void append_words(std::string& out, uint64_t seed, int64_t num_words);

/// Number of space-separated words in `text`: the bench's token estimate for its own text.
int64_t count_words(std::string_view text);

/// A stable 64-bit hash of a string (FNV-1a), for scopes and seeds.
uint64_t hash_string(std::string_view s);

/// A new cache-bust marker "[rid:<12 hex>]" from `seed`.
std::string session_marker(uint64_t seed);

}  // namespace cedar::bench
