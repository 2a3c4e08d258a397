// numpy's default generator, bit for bit: `numpy.random.default_rng(seed)` (SeedSequence
// hashing into PCG64's XSL-RR 128/64) and `Generator.integers(low, high, dtype=int64)`
// (Lemire's bounded draw). The checkpoint's Engram multipliers are drawn this way, so the hash
// of a real checkpoint depends on reproducing it exactly.
#pragma once

#include <cstdint>

namespace cedar::cpu {

class numpy_pcg64 {
 public:
  /// default_rng(seed) for a non-negative integer seed.
  explicit numpy_pcg64(uint64_t seed);

  /// The next raw 64-bit output (BitGenerator.random_raw()).
  uint64_t next64();

  /// The next 32-bit output: the low half of a 64-bit draw, then its high half.
  uint32_t next32();

  /// One value of integers(low, high, dtype=np.int64): uniform in [low, high), high > low.
  int64_t integers(int64_t low, int64_t high);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  uint32_t half_ = 0;  ///< the high half of the last 64-bit draw, when has_half_
  bool has_half_ = false;
};

}  // namespace cedar::cpu
