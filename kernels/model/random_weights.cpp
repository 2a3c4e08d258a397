// Deterministic random weights in checkpoint formats (see random_weights.hpp for the rules).
#include "kernels/model/random_weights.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "config/model_config.hpp"
#include "kernels/formats.hpp"

namespace cedar {

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// splitmix64: one 64-bit draw per call.
struct row_rng {
  uint64_t state;
  uint64_t next() { return mix64(state += 0x9E3779B97F4A7C15ull); }
  /// Approximately N(0, 1): sum of four 16-bit uniforms, centred and scaled (bounded by ~3.5).
  float normal() {
    const uint64_t r = next();
    const int sum = int(r & 0xFFFF) + int((r >> 16) & 0xFFFF) + int((r >> 32) & 0xFFFF) + int(r >> 48);
    return float(sum - 131070) * (1.0f / 37837.2f);  // 4 x mean 32767.5; 2 x std 18918.6
  }
  float uniform(float lo, float hi) { return lo + float(next() >> 40) * (hi - lo) / float(1 << 24); }
};

uint64_t tensor_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return mix64(h ^ mix64(seed + 0x632BE59BD9B4E019ull));
}

/// Eight E4M3 weight codes from 64 random bits: each byte keeps its sign and mantissa and gets
/// exponent field 5..8 (|v| in [0.25, 3.75]): (r & 0x9F) + 0x28 never carries across bytes, and
/// the largest code is 0x47 | sign, far from the NaN codes 0x7F / 0xFF.
uint64_t e4m3_codes8(uint64_t r) { return (r & 0x9F9F9F9F9F9F9F9Full) + 0x2828282828282828ull; }

/// RMS of the values e4m3_codes8() produces (every byte equally likely).
float e4m3_code_rms() {
  static const float rms = [] {
    double sum = 0;
    for (int b = 0; b < 256; ++b) {
      const double v = fmt::e4m3_to_f32(uint8_t(e4m3_codes8(uint64_t(b))));
      sum += v * v;
    }
    return float(std::sqrt(sum / 256));
  }();
  return rms;
}

/// RMS of uniformly random E2M1 nibbles.
float e2m1_code_rms() {
  static const float rms = [] {
    double sum = 0;
    for (int c = 0; c < 16; ++c) sum += double(fmt::e2m1_to_f32(uint8_t(c))) * fmt::e2m1_to_f32(uint8_t(c));
    return float(std::sqrt(sum / 16));
  }();
  return rms;
}

/// UE8M0 code whose power of two brings codes of RMS `code_rms` to RMS gain/sqrt(fan_in).
int scale_code_for(float code_rms, double fan_in, double gain) {
  return 127 + int(std::lround(std::log2(gain / (code_rms * std::sqrt(fan_in)))));
}

double gain_of(const tensor_spec& s) { return s.residual_out ? 0.25 : 1.0; }

/// Finite float -> bf16 bits, round to nearest even: fmt::f32_to_bf16 without its NaN case, inline
/// because embed and head (2 x 662M values for the real shapes) go through it.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

void fill_bf16(uint8_t* dst, int64_t n, row_rng& rng, float std_dev) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = bf16_bits(rng.normal() * std_dev);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

void fill_f32(uint8_t* dst, int64_t n, row_rng& rng, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = rng.uniform(lo, hi);
    std::memcpy(dst + 4 * i, &v, 4);
  }
}

/// n bytes: uniformly random (packed E2M1 pairs) or E4M3 weight codes.
void fill_bytes(uint8_t* dst, int64_t n, row_rng& rng, bool e4m3) {
  for (int64_t i = 0; i < n; i += 8) {
    const uint64_t r = e4m3 ? e4m3_codes8(rng.next()) : rng.next();
    std::memcpy(dst + i, &r, std::size_t(std::min<int64_t>(8, n - i)));  // little-endian byte order
  }
}

/// Scale codes around `base`: -1, 0, 0, +1 with equal odds, so a misplaced tile shows.
void fill_scales(uint8_t* dst, int64_t n, row_rng& rng, int base) {
  static constexpr int jitter[4] = {-1, 0, 0, 1};
  for (int64_t i = 0; i < n; i += 32) {
    uint64_t r = rng.next();
    for (int64_t j = i; j < std::min(n, i + 32); ++j, r >>= 2)
      dst[j] = uint8_t(std::clamp(base + jitter[r & 3], 1, 254));
  }
}

/// The mHC base: pre entries slightly positive, post 0, comb favouring the diagonal.
void fill_hc_base(uint8_t* dst, int64_t row, row_rng& rng, int hc) {
  float v = 0;
  if (row < hc) v = rng.uniform(0.0f, 0.5f);
  else if (row < 2 * hc) v = rng.uniform(-0.1f, 0.1f);
  else v = ((row - 2 * hc) / hc == (row - 2 * hc) % hc ? 1.0f : 0.0f) + rng.normal() * 0.5f;
  std::memcpy(dst, &v, 4);
}

void fill_row(const tensor_spec& s, uint8_t* dst, int64_t row, row_rng& rng) {
  const int64_t cols = s.shape.size() > 1 ? s.num_elements() / s.shape[0] : 1;
  const double in = double(cols);
  switch (s.role) {
    case tensor_role::embedding: return fill_bf16(dst, cols, rng, 1.0f);
    case tensor_role::head:
    case tensor_role::bf16_linear: return fill_bf16(dst, cols, rng, float(gain_of(s) / std::sqrt(in)));
    case tensor_role::norm: return void(std::fill_n(reinterpret_cast<uint16_t*>(dst), cols, fmt::f32_to_bf16(1.0f)));
    case tensor_role::hc_fn: {
      const float a = float(std::sqrt(3.0 / in));  // uniform with variance 1/in: mix ~ unit RMS
      return fill_f32(dst, cols, rng, -a, a);
    }
    case tensor_role::hc_base:  // shape [hc^2 + 2 hc]
      return fill_hc_base(dst, row, rng, int(std::lround(std::sqrt(double(s.shape[0]) + 1))) - 1);
    case tensor_role::hc_scale:  // pre, post, comb: post's is small so post stays near 1
      return row == 1 ? fill_f32(dst, 1, rng, 0.05f, 0.15f) : fill_f32(dst, 1, rng, 0.3f, 0.6f);
    case tensor_role::attn_sink: return fill_f32(dst, 1, rng, -0.1f, 0.1f);
    case tensor_role::gate_bias: return fill_f32(dst, 1, rng, -0.01f, 0.01f);
    case tensor_role::engram_qk: return fill_f32(dst, cols, rng, 0.9f, 1.1f);
    case tensor_role::fp8_weight:
    case tensor_role::engram_table: return fill_bytes(dst, cols, rng, true);
    case tensor_role::fp4_weight: return fill_bytes(dst, cols, rng, false);
    case tensor_role::fp8_scale: return fill_scales(dst, cols, rng, scale_code_for(e4m3_code_rms(), 32 * in, gain_of(s)));
    case tensor_role::fp4_scale: return fill_scales(dst, cols, rng, scale_code_for(e2m1_code_rms(), 32 * in, gain_of(s)));
    case tensor_role::engram_scale: return fill_scales(dst, cols, rng, scale_code_for(e4m3_code_rms(), 1, 1));
  }
}

/// Runs fn(i) for i in [0, n) on num_threads threads (each i exactly once).
template <class Fn>
void run_parallel(int64_t n, int num_threads, Fn fn) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& th : threads) th.join();
}

int threads_or_all(int num_threads) {
  return num_threads > 0 ? num_threads : std::max(1, int(std::thread::hardware_concurrency()));
}

}  // namespace

void fill_random_rows(const tensor_spec& spec, uint64_t seed, uint8_t* dst, int64_t row_begin, int64_t row_end) {
  const uint64_t base = tensor_seed(spec.name, seed);
  const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
  const std::size_t row_bytes = rows ? spec.num_bytes() / rows : 0;
  for (int64_t r = row_begin; r < row_end; ++r) {
    row_rng rng{mix64(base + uint64_t(r) * 0xD1B54A32D192ED03ull)};
    fill_row(spec, dst + (r - row_begin) * row_bytes, r, rng);
  }
}

tensor_map make_random_weights(const model_args& args, uint64_t seed, const progress_fn& progress, int num_threads) {
  const std::vector<tensor_spec> specs = model_inventory(args);
  tensor_map out;
  struct block {
    const tensor_spec* spec;
    uint8_t* data;
    int64_t row_begin, row_end;
    std::size_t bytes;
  };
  std::vector<block> blocks;
  uint64_t total = 0;
  for (const tensor_spec& s : specs) {
    uint8_t* data = out.add_owned(s.name, s.dtype, s.shape);
    const int64_t rows = s.shape.empty() ? 1 : s.shape[0];
    const std::size_t row_bytes = rows ? s.num_bytes() / rows : 0;
    const int64_t rows_per_block = std::max<int64_t>(1, int64_t((std::size_t(1) << 20) / std::max<std::size_t>(row_bytes, 1)));
    for (int64_t r = 0; r < rows; r += rows_per_block) {
      const int64_t e = std::min(rows, r + rows_per_block);
      blocks.push_back({&s, data + r * row_bytes, r, e, std::size_t(e - r) * row_bytes});
    }
    total += s.num_bytes();
  }
  std::mutex progress_mutex;
  uint64_t done = 0;
  run_parallel(int64_t(blocks.size()), threads_or_all(num_threads), [&](int64_t i) {
    const block& b = blocks[i];
    fill_random_rows(*b.spec, seed, b.data, b.row_begin, b.row_end);
    if (!progress) return;
    std::lock_guard<std::mutex> lock(progress_mutex);
    done += b.bytes;
    progress(done, total);
  });
  return out;
}

std::vector<tensor_source> random_weight_sources(const model_args& args, uint64_t seed) {
  std::vector<tensor_source> sources;
  for (tensor_spec& s : model_inventory(args)) {
    auto spec = std::make_shared<const tensor_spec>(std::move(s));
    sources.push_back(tensor_source{spec->name, spec->dtype, spec->shape,
                                    [spec, seed](uint8_t* dst, int64_t lo, int64_t hi) {
                                      fill_random_rows(*spec, seed, dst, lo, hi);
                                    }});
  }
  return sources;
}

bool write_random_checkpoint(const model_args& args, uint64_t seed, const std::string& dir, uint64_t max_shard_bytes,
                             const progress_fn& progress, std::string* error, int num_threads) {
  safetensors_write_options options;
  options.max_shard_bytes = max_shard_bytes;
  options.num_threads = threads_or_all(num_threads);
  options.progress = progress;
  if (!write_safetensors(dir, random_weight_sources(args, seed), options, error)) return false;
  const std::string path = dir + "/config.json";
  std::ofstream out(path, std::ios::binary);
  out << model_config_json(args);
  if (!out.flush()) {
    if (error) *error = path + ": write failed";
    return false;
  }
  return true;
}

}  // namespace cedar
