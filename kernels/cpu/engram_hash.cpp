// Engram hashing (spec §2.8): the per-layer multipliers, primes and row offsets, and the
// n-gram row ids of each token. Integer arithmetic only, so every backend agrees exactly.
// The real checkpoint draws its multipliers with numpy's default_rng(10007 * layer); that
// generator is not reproduced here: the multipliers come from splitmix64 with the same seed.
// The primes and offsets do follow the checkpoint (successive primes >= engram_vocab_size).
#include <vector>

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

std::vector<engram_hash_params> engram_default_params(const std::vector<int>& layer_ids,
                                                      int max_ngram, int heads,
                                                      int64_t vocab_size, int32_t pad_id) {
  CEDAR_OP_CHECK(max_ngram >= 2 && max_ngram <= 8, "n-gram sizes 2..max_ngram fit the table");
  CEDAR_OP_CHECK(heads > 0 && (max_ngram - 1) * heads <= 32, "(n, head) ranges fit the table");
  std::vector<engram_hash_params> out;
  int64_t candidate = vocab_size;
  for (int layer : layer_ids) {
    engram_hash_params p;
    p.max_ngram = max_ngram;
    p.num_heads = heads;
    p.pad_id = pad_id;
    uint64_t state = 10007ull * static_cast<uint64_t>(layer);
    for (int i = 0; i < max_ngram; ++i) p.multipliers[i] = static_cast<int64_t>(splitmix64(state) | 1);
    int64_t offset = 0;
    for (int i = 0; i < (max_ngram - 1) * heads; ++i) {
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

void engram_rows(const int32_t* cids, int64_t first, int m, const engram_hash_params& p,
                 int64_t* rows) {
  const int per_token = (p.max_ngram - 1) * p.num_heads;
  for (int t = 0; t < m; ++t) {
    const int64_t pos = first + t;
    int64_t* out = rows + static_cast<int64_t>(t) * per_token;
    uint64_t rolling = 0;  // wrapping int64 arithmetic, done unsigned to stay defined
    for (int i = 0; i < p.max_ngram; ++i) {
      const int64_t tok = pos - i >= 0 ? cids[pos - i] : p.pad_id;
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
