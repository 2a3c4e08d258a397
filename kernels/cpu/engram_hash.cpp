// Engram hashing (spec §2.8): the per-layer multipliers, primes and row offsets, and the
// n-gram row ids of each token. Integer arithmetic only, so every backend agrees exactly. With a
// token map (a served model) every piece is the checkpoint reference's (numpy draws, successive
// primes); a bare config (the presets in unit tests) keeps splitmix64 multipliers, which the
// spec allows for random weights and which the GPU suite's statistical bounds were set on.
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/numpy_random.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/ops.hpp"

namespace cedar::cpu {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t f = 3; f * f <= n; f += 2) {
    if (n % f == 0) return false;
  }
  return true;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// x mod p in [0, p) for any int64 x and p > 0.
int64_t floor_mod(int64_t x, int64_t p) {
  const int64_t r = x % p;
  return r < 0 ? r + p : r;
}

}  // namespace

std::vector<engram_hash_params> engram_default_params(const engram_hash_config& c) {
  CEDAR_OP_CHECK(c.max_ngram >= 2 && c.max_ngram <= 8, "n-gram sizes 2..max_ngram fit the table");
  CEDAR_OP_CHECK(c.heads > 0 && (c.max_ngram - 1) * c.heads <= 32, "(n, head) ranges fit the table");
  CEDAR_OP_CHECK(c.compressed_vocab > 0, "a compressed vocabulary");
  const int64_t half_bound = std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / c.compressed_vocab / 2);
  int32_t pad = c.pad_token;
  if (c.token_map) {
    CEDAR_OP_CHECK(pad >= 0 && std::size_t(pad) < c.token_map->size(), "the pad token is in the token map");
    pad = (*c.token_map)[std::size_t(pad)];
  }
  std::vector<engram_hash_params> out;
  int64_t candidate = c.vocab_size;
  for (int layer : c.layer_ids) {
    engram_hash_params p;
    p.max_ngram = c.max_ngram;
    p.num_heads = c.heads;
    p.pad_id = pad;
    p.token_map = c.token_map;
    if (c.token_map) {  // the checkpoint's draws
      numpy_pcg64 rng(10007ull * uint64_t(layer));
      for (int i = 0; i < c.max_ngram; ++i) p.multipliers[i] = rng.integers(0, half_bound) * 2 + 1;
    } else {  // a bare config: its own constants, which the random-weight presets were built on
      uint64_t state = 10007ull * uint64_t(layer);
      for (int i = 0; i < c.max_ngram; ++i) p.multipliers[i] = int64_t(splitmix64(state) | 1);
    }
    int64_t offset = 0;
    for (int i = 0; i < (c.max_ngram - 1) * c.heads; ++i) {
      while (!is_prime(candidate)) ++candidate;
      p.primes[i] = candidate++;
      p.offsets[i] = offset;
      offset += p.primes[i];
    }
    out.push_back(p);
  }
  return out;
}

int64_t engram_table_rows(const engram_hash_params& p) {
  int64_t rows = 0;
  for (int i = 0; i < (p.max_ngram - 1) * p.num_heads; ++i) rows += p.primes[i];
  return rows;
}

void engram_rows(const int32_t* ids, int64_t first, int m, const engram_hash_params& p,
                 int64_t* rows) {
  const int per_token = (p.max_ngram - 1) * p.num_heads;
  const std::vector<int32_t>* map = p.token_map.get();
  auto compressed = [&](int64_t pos) -> int64_t {
    if (pos < 0) return p.pad_id;
    const int32_t id = ids[pos];
    if (!map) return id;
    CEDAR_OP_CHECK(id >= 0 && std::size_t(id) < map->size(), "token id inside the Engram token map");
    return (*map)[std::size_t(id)];
  };
  for (int t = 0; t < m; ++t) {
    const int64_t pos = first + t;
    int64_t* out = rows + static_cast<int64_t>(t) * per_token;
    uint64_t rolling = 0;  // wrapping int64 arithmetic, done unsigned to stay defined
    for (int i = 0; i < p.max_ngram; ++i) {
      const int64_t tok = compressed(pos - i);
      rolling ^= static_cast<uint64_t>(tok) * static_cast<uint64_t>(p.multipliers[i]);
      if (i == 0) continue;  // n-gram size n = i + 1 is complete
      for (int h = 0; h < p.num_heads; ++h) {
        const int k = (i - 1) * p.num_heads + h;
        out[k] = p.offsets[k] + floor_mod(static_cast<int64_t>(rolling), p.primes[k]);
      }
    }
  }
}

}  // namespace cedar::cpu
