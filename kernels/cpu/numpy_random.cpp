// numpy's SeedSequence -> PCG64 -> bounded integers (kernels/cpu/numpy_random.hpp).
#include "kernels/cpu/numpy_random.hpp"

#include <array>
#include <vector>

namespace cedar::cpu {
namespace {

using u128 = unsigned __int128;

// SeedSequence's hash constants (numpy/random/bit_generator.pyx).
constexpr uint32_t init_a = 0x43b0d7e5, mult_a = 0x931e8875;
constexpr uint32_t init_b = 0x8b51f9dd, mult_b = 0x58f38ded;
constexpr uint32_t mix_mult_l = 0xca01f9dd, mix_mult_r = 0x4973f715;
constexpr int xshift = 16, pool_size = 4;

/// SeedSequence(seed).generate_state(4, uint64): the pool mixed from the seed's 32-bit words.
std::array<uint64_t, 4> seed_sequence_state(uint64_t seed) {
  std::vector<uint32_t> entropy;  // the seed's 32-bit words, least significant first; 0 -> [0]
  do {
    entropy.push_back(uint32_t(seed));
    seed >>= 32;
  } while (seed != 0);
  uint32_t hash_const = init_a;
  auto hashmix = [&](uint32_t value) {
    value ^= hash_const;
    hash_const *= mult_a;
    value *= hash_const;
    return value ^ (value >> xshift);
  };
  auto mix = [](uint32_t x, uint32_t y) {
    const uint32_t r = mix_mult_l * x - mix_mult_r * y;
    return r ^ (r >> xshift);
  };
  std::array<uint32_t, pool_size> pool{};
  for (int i = 0; i < pool_size; ++i) pool[i] = hashmix(i < int(entropy.size()) ? entropy[i] : 0);
  for (int src = 0; src < pool_size; ++src) {
    for (int dst = 0; dst < pool_size; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
    }
  }
  for (std::size_t src = pool_size; src < entropy.size(); ++src) {
    for (int dst = 0; dst < pool_size; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  }
  std::array<uint32_t, 8> words{};
  uint32_t out_const = init_b;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % pool_size] ^ out_const;
    out_const *= mult_b;
    v *= out_const;
    words[i] = v ^ (v >> xshift);
  }
  std::array<uint64_t, 4> state{};  // uint32 pairs read as little-endian uint64
  for (int i = 0; i < 4; ++i) state[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return state;
}

constexpr u128 pcg_multiplier = (u128(2549297995355413924ull) << 64) | u128(4865540595714422341ull);

}  // namespace

numpy_pcg64::numpy_pcg64(uint64_t seed) {
  const std::array<uint64_t, 4> v = seed_sequence_state(seed);
  const u128 init_state = (u128(v[0]) << 64) | v[1];
  const u128 init_seq = (u128(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (init_seq << 1) | 1;
  state_ = state_ * pcg_multiplier + inc_;
  state_ += init_state;
  state_ = state_ * pcg_multiplier + inc_;
}

uint32_t numpy_pcg64::next32() {
  if (has_half_) {
    has_half_ = false;
    return half_;
  }
  const uint64_t v = next64();
  half_ = uint32_t(v >> 32);
  has_half_ = true;
  return uint32_t(v);
}

uint64_t numpy_pcg64::next64() {
  state_ = state_ * pcg_multiplier + inc_;
  const uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

int64_t numpy_pcg64::integers(int64_t low, int64_t high) {
  const uint64_t range = uint64_t(high) - uint64_t(low) - 1;  // inclusive span, as numpy keeps it
  if (range == 0) return low;
  if (range == 0xFFFFFFFFull) return low + int64_t(next32());
  if (range < 0xFFFFFFFFull) {  // numpy's 32-bit Lemire draw on buffered 32-bit halves
    const uint64_t excl = range + 1;
    uint64_t m = uint64_t(next32()) * excl;
    if (uint32_t(m) < excl) {
      const uint32_t threshold = uint32_t((0xFFFFFFFFull - range) % excl);
      while (uint32_t(m) < threshold) m = uint64_t(next32()) * excl;
    }
    return low + int64_t(m >> 32);
  }
  const uint64_t excl = range + 1;
  u128 m = u128(next64()) * excl;
  uint64_t leftover = uint64_t(m);
  if (leftover < excl) {
    const uint64_t threshold = (~uint64_t(0) - range) % excl;
    while (leftover < threshold) {
      m = u128(next64()) * excl;
      leftover = uint64_t(m);
    }
  }
  return low + int64_t(uint64_t(m >> 64));
}

}  // namespace cedar::cpu
