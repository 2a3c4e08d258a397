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

/// Devices present (0 without a driver). A thread's ops run on its current device (CUDA's
/// per-thread device): each rank of a multi-GPU layout keeps one thread on one device.
int device_count();
void set_device(int device);
int current_device();
/// Ops are enqueued on this stream (a cudaStream_t; nullptr = the legacy default stream). The
/// stream, like the device, is the calling thread's.
void set_stream(void* stream);
void* current_stream();
/// Waits for the current stream; aborts with the CUDA error if one occurred.
void synchronize();

/// CUDA graphs. Between graph_capture_begin and graph_capture_end the ops are recorded (on a
/// private capture stream, relaxed mode) instead of run; graph_capture_end returns the
/// executable graph, which graph_launch runs on the current stream. Captured ops must not copy
/// from pageable host memory or wait for the device.
void graph_capture_begin();
void* graph_capture_end();
void graph_launch(void* exec);
void graph_destroy(void* exec);

/// Brackets a window for an external profiler (ncu --profile-from-start off): cudaProfilerStart
/// and cudaProfilerStop.
void profiler_start();
void profiler_stop();

/// The high-water mark of bytes in use from the device's stream-ordered pool (every scratch
/// and activation buffer of the ops; not the weights or the KV arena) since the last reset.
uint64_t scratch_high_water();
void reset_scratch_high_water();
/// Keeps the current device's stream-ordered pool mapped between steps: by default the pool
/// hands its free memory back to the driver at every synchronization, and the next step maps
/// (and the driver clears) it again, gigabytes a layer at prefill. Once per device; the pool
/// then holds at most the high-water mark of what the ops had in use at once.
void keep_scratch_mapped();

/// Device allocation (aborts on failure) and release.
void* device_alloc(std::size_t bytes);
void device_free(void* p);
/// Releases pinned host memory (cudaHostAlloc's).
void host_free(void* p);
/// Copies on the current stream, then waits for it (host memory may be pageable).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
/// Fills bytes with `byte` (used to poison outputs in tests).
void fill_bytes(void* dst, int byte, std::size_t bytes);
/// Copies host -> device on the current stream without waiting for the copy to finish (the
/// host bytes may be reused as soon as this returns).
void copy_to_device_async(void* dst, const void* src, std::size_t bytes);
/// rows rows of row_bytes each, device to device, between pitched layouts (on the current stream).
void copy_rows_device(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t row_bytes, std::size_t rows);
/// Stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on the current stream).
void* scratch_alloc(std::size_t bytes);
void scratch_free(void* p);
/// Free and total device memory in bytes, after waiting for the device and handing the scratch
/// pool's unused memory back (so that it counts as free).
void memory_info(std::size_t* free_bytes, std::size_t* total_bytes);

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
/// The bf16 linear layer the compressor's projections run: linear_bf16 above (exact), or the
/// fast kernel set's (kernels/cuda/fast/fast_ops.hpp).
using bf16_linear_fn = void (*)(const float* x, int m, const bf16_weight& w, float* y);
/// tail: device [2, d]. Returns the number of latents (known on the host from first_pos, m).
int compress_ratio2(const float* x, int m, int64_t first_pos, const bf16_weight& wkv,
                    const bf16_weight& wgate, const float* norm, float eps, float* tail,
                    float* latents, bf16_linear_fn linear = linear_bf16);
void compress_ratio1(const float* x, int m, const bf16_weight& wkv, const float* norm, float eps,
                     float* latents, bf16_linear_fn linear = linear_bf16);
/// compress_ratio2 for m one-row items side by side (decode): row merge_rows[i] (an odd
/// position) completes its pair with the even token parked in merge_tails[i] (device [2, d]),
/// giving latent i; row save_rows[j] (an even position) is parked in save_tails[j]. Device
/// arrays; the two lists name different items.
void compress_ratio2_rows(const float* x, int m, const bf16_weight& wkv, const bf16_weight& wgate,
                          const float* norm, float eps, const int32_t* merge_rows, float* const* merge_tails,
                          int num_merge, const int32_t* save_rows, float* const* save_tails, int num_save,
                          float* latents, bf16_linear_fn linear = linear_bf16);
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

// ---- forward-pass plumbing (the GPU model's device-side steps) -------------------------------

/// Record formats of formats.hpp: FP8 per 32, FP4 with E4M3 scale per 16, FP4 with UE8M0 per 32.
enum class record_kind : uint8_t { fp8, fp4_e4m3, fp4_pow2 };
/// Packs row r of x [m, d] into the record at dst[r] (device array of m device pointers).
void store_records(record_kind kind, const float* x, int m, int d, uint8_t* const* dst);
/// Unpacks the record at src[r] into row r of x [m, d].
void load_records(record_kind kind, const uint8_t* const* src, int m, int d, float* x);
/// X[r, h] = e[r] for every copy h; pre[r] = (1, 0, ..., 0) (spec §2.1).
void hc_expand(const float* e /*[m, d]*/, int m, int hc, int d, float* X /*[m, hc, d]*/,
               float* pre /*[m, hc]*/);
/// Candidate rows of one item's attention: row t = window positions max(floor, p0+t-W+1) ..
/// p0+t (as offsets from ring_lo, then -1 up to W), then num_window + topk[t, k] (or -1).
void attention_candidates(const int32_t* topk /*[T, K] or null*/, int T, int K, int W, int64_t p0,
                          int64_t floor_pos, int64_t ring_lo, int num_window,
                          int32_t* idx /*[T, W + K]*/);
/// scores[r, j] = -inf where mask[r, j / block] == 0.
void mask_scores(float* scores /*[m, n]*/, int m, int n, int block, const uint8_t* mask /*[m, nb]*/,
                 int nb);
/// x[i] *= s.
void scale_values(float* x, std::size_t n, float s);
/// Device-to-device copy on the current stream.
void copy_device(void* dst, const void* src, std::size_t bytes);
/// Largest |x| (+inf if any value is not finite), copied to the host (waits for the stream).
float max_abs(const float* x, std::size_t n);

// ---- sampling ----------------------------------------------------------------------------------

/// out[r] = argmax of logits row r (ties to the lowest id), device arrays.
void argmax_rows(const float* logits /*[m, vocab]*/, int m, int vocab, int32_t* out /*[m]*/);

/// One row's sampling request, as actors/sampler.hpp's sampling_params plus the token index.
struct sample_request {
  float temperature = 0.f;  ///< 0 = greedy (ties to the lowest id)
  int top_k = 0;            ///< 0 = all
  float top_p = 1.f;        ///< 1 = all
  uint64_t seed = 0;
  int64_t token_idx = 0;    ///< index of the generated token within its request
};

/// Samples one token per row exactly as actors/sampler.cpp's sample() does: with top-k or
/// top-p, ids ordered by logit (ties to the lowest id), else in index order; softmax of logit /
/// temperature in double, the top-p cut, and the draw splitmix64(splitmix64(seed) ^ token_idx),
/// every sum in kernels/sampling_order.hpp's blocked order. tokens [m] and logprobs [m]
/// (log-softmax of the raw logits at the token) are device arrays; requests is a host array.
/// leave_greedy: rows at temperature 0 keep what tokens and logprobs hold (greedy_rows' answer).
void sample_rows(const float* logits /*[m, vocab]*/, int m, int vocab, const sample_request* requests,
                 int32_t* tokens /*[m]*/, float* logprobs /*[m]*/, bool leave_greedy = false);

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda
