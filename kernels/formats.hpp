// Number formats of V4.1-Flash (spec §3, §4.2): FP8 E4M3, UE8M0 scales, FP4 E2M1, bf16,
// the activation fake-quant rules, and the three KV record layouts. Pure functions on host
// memory; the CUDA backend reproduces them bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::fmt {

// ---- scalar codecs -------------------------------------------------------------------

/// bf16 bits -> float, and float -> bf16 bits with round-to-nearest-even (NaN stays NaN).
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);
/// Rounds x to the nearest bf16 value (returned as float).
float round_bf16(float x);

/// OCP FP8 E4M3 (e4m3fn): bias 7, no infinities, 0x7F/0xFF are NaN, max 448.
/// Encoding rounds half to even and saturates to +-448; NaN encodes as 0x7F.
float e4m3_to_f32(uint8_t code);
uint8_t f32_to_e4m3(float x);

/// UE8M0 (E8M0) scale: value 2^(code-127); code 255 is NaN.
float ue8m0_to_f32(uint8_t code);
/// Code of an exact power of two 2^e (e in [-127, 127]).
uint8_t ue8m0_from_exponent(int e);

/// FP4 E2M1: codes 0-7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, 8-15 their negatives.
/// Encoding rounds half to even and saturates at +-6.
float e2m1_to_f32(uint8_t code);
uint8_t f32_to_e2m1(float x);

// ---- activation fake-quant (spec §3.3) -----------------------------------------------

constexpr int fp8_group = 32;
constexpr int fp4_kv_group = 16;
constexpr int fp4_pow2_group = 32;

/// Power-of-two scale for an FP8 group: 2^ceil(log2(max(amax, 1e-4) * fp32(1/448))).
float fp8_group_scale(float amax);
/// Quantizes n values (n % 32 == 0) in groups of 32 to E4M3 codes plus one UE8M0 code per group.
void quantize_fp8(const float* x, int n, uint8_t* codes, uint8_t* scale_codes);
/// In place: x <- dequant(quant(x)) with the FP8 per-32 rule.
void fake_quant_fp8(float* x, int n);

/// Power-of-two scale for an FP4 group of 32 (MXFP4 style):
/// 2^ceil(log2(max(amax, 6*2^-126) * fp32(1/6))).
float fp4_pow2_scale(float amax);
/// In place: FP4 per-32 with power-of-two scale (index q/k, expert activations' weights).
void fake_quant_fp4_pow2(float* x, int n);

/// E4M3 scale for an FP4 group of 16: e4m3(max(amax, 6*2^-9) / 6), saturating at 448.
uint8_t fp4_e4m3_scale_code(float amax);
/// In place: FP4 per-16 with an E4M3 scale (compressed KV latents).
void fake_quant_fp4_e4m3(float* x, int n);

// ---- KV records (spec §3.1, §3.2) ----------------------------------------------------
//
// compressed latent, FP4: [256 B packed E2M1, low nibble = even index][32 B E4M3 scale per 16] = 288 B
// index key, FP4:         [64 B packed E2M1][4 B UE8M0 scale per 32]                          = 68 B
// SWA record, FP8:        [512 B E4M3][16 B UE8M0 per 32]                                     = 528 B
// With --kv-dtype fp8 the global records use the SWA layout: latent 528 B, index key 132 B.

constexpr int latent_dim = 512;
constexpr int index_key_dim = 128;
constexpr std::size_t latent_fp4_bytes = 288;
constexpr std::size_t index_key_fp4_bytes = 68;
constexpr std::size_t latent_fp8_bytes = 528;
constexpr std::size_t index_key_fp8_bytes = 132;
constexpr std::size_t swa_record_bytes = 528;

/// Record size in bytes of a dim-d vector stored as FP4 (e4m3 scale per 16, used for latents)
/// or FP4 (ue8m0 scale per 32, used for index keys) or FP8 (ue8m0 per 32).
constexpr std::size_t fp4_e4m3_record_bytes(int d) { return d / 2 + d / 16; }
constexpr std::size_t fp4_pow2_record_bytes(int d) { return d / 2 + d / 32; }
constexpr std::size_t fp8_record_bytes(int d) { return d + d / 32; }

/// Packs d values (already on the grid or not: they are quantized) into a record.
void pack_fp4_e4m3(const float* x, int d, uint8_t* rec);
void unpack_fp4_e4m3(const uint8_t* rec, int d, float* x);
void pack_fp4_pow2(const float* x, int d, uint8_t* rec);
void unpack_fp4_pow2(const uint8_t* rec, int d, float* x);
void pack_fp8(const float* x, int d, uint8_t* rec);
void unpack_fp8(const uint8_t* rec, int d, float* x);

}  // namespace cedar::fmt
