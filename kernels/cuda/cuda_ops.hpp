// The CUDA backend of the op interface (kernels/ops.hpp): the same ops with the same
// parameters, every pointer a device pointer (weights views included), enqueued on the current
// stream. Plain C++ header: it compiles without CUDA (then only available()/status() exist,
// from kernels/cuda_stub.cpp, and say "built without CUDA").
//
// Numerics: each output is reduced in the CPU's dot_order (kernels/cpu/dot.hpp) by one warp
// (lane l sums k = 32b + l; the shuffle fold 16, 8, 4, 2, 1 is exactly the CPU's a0 + a1 and
// half folds), products and sums rounded separately (built with --fmad=false), so the linear
// layers, norms, mHC mixing, attention scores and indexer scores give the CPU's bits. exp, log1p,
// cos and sin are evaluated in double and rounded once, which matches the CPU's libm except in
// rare last-ulp cases. Every op is batch-invariant: no reduction depends on the row count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/ops.hpp"
#include "kernels/weights.hpp"

namespace cedar::cuda {

// ---- device and memory ---------------------------------------------------------------------

/// True when built with CUDA and a device is present.
bool available();
/// One line: the device name and memory, "no CUDA device: ...", or "built without CUDA".
std::string status();

#ifdef CEDAR_HAVE_CUDA

/// Ops are enqueued on this stream (a cudaStream_t; nullptr = the legacy default stream).
void set_stream(void* stream);
void* current_stream();
/// Waits for the current stream; aborts with the CUDA error if one occurred.
void synchronize();

/// Device allocation (aborts on failure) and release.
void* device_alloc(std::size_t bytes);
void device_free(void* p);
/// Copies on the current stream, then waits for it (host memory may be pageable).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
/// Fills bytes with `byte` (used to poison outputs in tests).
void fill_bytes(void* dst, int byte, std::size_t bytes);

// ---- linear layers (ops.hpp semantics) ----------------------------------------------------------

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y);
void linear_fp4(const float* x, int m, const fp4_weight& w, float* y);
void linear_bf16(const float* x, int m, const bf16_weight& w, float* y);
void linear_f32(const float* x, int m, const float* w, int out, int in, float* y);

// ---- norms, positions, mHC ----------------------------------------------------------------

void rmsnorm(const float* x, int m, int d, const float* w, float eps, float* y);
/// positions: device [m]. Frequencies are computed on the host exactly as cpu::rope_frequencies.
void rope(float* x, int m, int num_heads, int head_dim, const int32_t* positions,
          const cpu::rope_params& p, bool inverse);
void hc_mix(const float* X, int m, int hc, int d, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre,
            float* post, float* comb);
void hc_collapse(const float* X, const float* pre, int m, int hc, int d, float* out);
void hc_post(const float* f, const float* X, const float* post, const float* comb, int m, int hc,
             int d, float* X_out);

// ---- attention, compressors, indexer ------------------------------------------------------

void sparse_attention(const float* q, int m, int num_heads, int dim, const float* kv,
                      const int32_t* idx, int num_idx, const float* sink, float scale, float* out);
void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a,
                    const fp8_weight& wo_b, float* out);
/// tail: device [2, d]. Returns the number of latents (known on the host from first_pos, m).
int compress_ratio2(const float* x, int m, int64_t first_pos, const bf16_weight& wkv,
                    const bf16_weight& wgate, const float* norm, float eps, float* tail,
                    float* latents);
void compress_ratio1(const float* x, int m, const bf16_weight& wkv, const float* norm, float eps,
                     float* latents);
void index_scores(const float* q, const float* w, int m, int heads, int dim, const float* keys,
                  int num_keys, const int32_t* num_visible, float* scores);
void topk_indices(const float* scores, int m, int n, int k, int32_t* out);
void candidate_blocks(const float* scores, int m, int n, int block, int keep,
                      const int32_t* num_visible, uint8_t* mask);

// ---- KV records (kernels/formats.hpp layouts, bit-exact) ----------------------------------------

/// rec [m, record bytes] from x [m, d], and back.
void pack_fp8_rows(const float* x, int m, int d, uint8_t* rec);
void unpack_fp8_rows(const uint8_t* rec, int m, int d, float* x);
void pack_fp4_e4m3_rows(const float* x, int m, int d, uint8_t* rec);
void unpack_fp4_e4m3_rows(const uint8_t* rec, int m, int d, float* x);
void pack_fp4_pow2_rows(const float* x, int m, int d, uint8_t* rec);
void unpack_fp4_pow2_rows(const uint8_t* rec, int m, int d, float* x);
/// In place fake-quant of m rows of d values (the formats.hpp rules).
void fake_quant_fp8_rows(float* x, int m, int d);
void fake_quant_fp4_pow2_rows(float* x, int m, int d);
void fake_quant_fp4_e4m3_rows(float* x, int m, int d);
/// x <- round_bf16(x) elementwise.
void round_bf16(float* x, std::size_t n);

// ---- MoE, Engram, embedding --------------------------------------------------------------------

void moe_route(const float* y, int m, const bf16_weight& gate, const float* bias, int topk,
               float route_scale, int32_t* sel, float* weights);
void expert_ffn_fp4(const float* y, int m, const cpu::expert_weights& e, const float* weight,
                    float limit, float* out);
void expert_ffn_fp8(const float* y, int m, const cpu::shared_expert_weights& e, float limit,
                    float* out);
/// experts and shared are HOST arrays of views whose pointers are device pointers; sel and
/// weights are device arrays. Tokens are permuted by expert on the device (no host round trip).
void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared,
             float limit, float* out);
/// rows: device [m, rows_per_token] (cpu::engram_rows computes them from the token ids).
void engram(float* X, int m, int hc, int d, const int64_t* rows, int rows_per_token,
            const cpu::engram_weights& w, float eps);
void embed(const int32_t* tokens, int m, const bf16_weight& table, float* out);

// ---- sampling ----------------------------------------------------------------------------------

/// out[r] = argmax of logits row r (ties to the lowest id), device arrays.
void argmax_rows(const float* logits /*[m, vocab]*/, int m, int vocab, int32_t* out /*[m]*/);

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda
