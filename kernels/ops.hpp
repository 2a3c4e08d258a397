// The op interface of the V4.1-Flash forward pass. `cpu::` is the reference backend: readable
// loops, fp32 accumulation, rows spread over all cores. Every op is batch-invariant: a row's
// result depends only on that row's inputs, never on how many rows are in the call.
// Activations are fp32 rows; where the reference stores bf16, the caller rounds (fmt::round_bf16).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/weights.hpp"

namespace cedar::cpu {

// ---- linear layers ---------------------------------------------------------------------

/// y = W x for m rows. x is FP8-fake-quantized per 32 along `in` (a private copy; x is not
/// changed), then y[n] = sum_kb sx[kb] * sw[n/32][kb] * sum_{k in kb} xq[k] * wq[n][k].
void linear_fp8(const float* x,  // [m, w.in]
                int m, const fp8_weight& w,
                float* y);       // [m, w.out]

/// As linear_fp8 with an FP4 weight (W4A8: activation FP8 per 32, weight E2M1 * ue8m0 per 32).
void linear_fp4(const float* x,  // [m, w.in]
                int m, const fp4_weight& w,
                float* y);       // [m, w.out]

/// y = W x with a bf16 weight, fp32 activations and accumulation (no activation quant).
void linear_bf16(const float* x,  // [m, w.in]
                 int m, const bf16_weight& w,
                 float* y);       // [m, w.out]

/// y = W x with an fp32 weight [out, in].
void linear_f32(const float* x, int m, const float* w, int out, int in, float* y);

// ---- norms and positions ---------------------------------------------------------------

/// y[r] = w * x[r] * rsqrt(mean(x[r]^2) + eps), fp32. In place is allowed (y == x).
void rmsnorm(const float* x,  // [m, d]
             int m, int d, const float* w /*[d]*/, float eps,
             float* y);       // [m, d]

/// The rotary table of one layer type: theta, optionally with YaRN frequency blending.
struct rope_params {
  int rope_dim = 64;            ///< rotated dims: the last rope_dim of each head
  double theta = 10000.0;
  bool yarn = false;
  double yarn_factor = 16.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_pos = 65536;
};

/// The rope_dim/2 frequencies of a table (spec §2.3 RoPE), YaRN-blended when p.yarn.
void rope_frequencies(const rope_params& p, double* freqs /*[rope_dim/2]*/);

/// Rotates, for each row r and head h, the last p.rope_dim values of x[r, h, :] at
/// positions[r] (GPT-J adjacent pairs). inverse = conjugate rotation (used on attention out).
void rope(float* x,  // [m, num_heads, head_dim]
          int m, int num_heads, int head_dim, const int32_t* positions /*[m]*/,
          const rope_params& p, bool inverse);

// ---- mHC (manifold-constrained hyper-connections) --------------------------------------

/// HCMix for m tokens: X [m, hc, d] -> pre [m, hc], post [m, hc], comb [m, hc, hc]
/// (comb[j][k]: weight of copy j in output copy k). All fp32, spec §2.2.
void hc_mix(const float* X, int m, int hc, int d,
            const float* fn,     // [hc*hc + 2*hc, hc*d] fp32
            const float* scale,  // [3]
            const float* base,   // [hc*hc + 2*hc]
            int sinkhorn_iters, float hc_eps, float norm_eps,
            float* pre, float* post, float* comb);

/// out[r] = sum_j pre[r, j] * X[r, j, :].
void hc_collapse(const float* X /*[m, hc, d]*/, const float* pre /*[m, hc]*/, int m, int hc,
                 int d, float* out /*[m, d]*/);

/// X'[r, k] = round_bf16(post[r, k] * f[r] + sum_j comb[r, j, k] * X[r, j]). In place allowed.
void hc_post(const float* f /*[m, d]*/, const float* X /*[m, hc, d]*/, const float* post,
             const float* comb, int m, int hc, int d, float* X_out /*[m, hc, d]*/);

// ---- attention ---------------------------------------------------------------------------

/// Sparse MQA with a per-head sink: for query row r and head h,
/// o[r, h] = sum_c softmax'(q[r,h] . kv[idx[r,c]] * scale) kv[idx[r,c]], where the softmax
/// denominator also holds exp(sink[h] - max). idx < 0 entries are skipped. K = V.
void sparse_attention(const float* q,     // [m, num_heads, dim]
                      int m, int num_heads, int dim,
                      const float* kv,    // [num_kv, dim]
                      const int32_t* idx, // [m, num_idx] rows of kv, -1 = empty
                      int num_idx, const float* sink /*[num_heads]*/, float scale,
                      float* out);        // [m, num_heads, dim]

/// Grouped output LoRA (spec §2.3 step 9): u_g = Wo_a[g] o_g (bf16 weight [groups*rank,
/// heads_per_group*dim] read block-diagonally), out = Wo_b concat(u) (FP8).
void grouped_output(const float* o,  // [m, num_heads*dim]
                    int m, int groups, const bf16_weight& wo_a, const fp8_weight& wo_b,
                    float* out);     // [m, wo_b.out]

// ---- compressor and indexer ---------------------------------------------------------------

/// Ratio-2 compressor over `m` consecutive tokens starting at position first_pos. a = Wkv x,
/// g = Wgate x (fp32). Pairs (2j, 2j+1) emit latent_j = RMSNorm(sum_t softmax_t(g)[c] a_t[c]).
/// tail [2, d]: (a, g) of the pending even token; it is read when first_pos is odd and written
/// when the last token is even. Returns the number of latents written to `latents`
/// (raw, pre-RoPE); latent i stands for pair index (first complete pair) + i.
int compress_ratio2(const float* x /*[m, in]*/, int m, int64_t first_pos,
                    const bf16_weight& wkv, const bf16_weight& wgate, const float* norm,
                    float eps, float* tail /*[2, d]*/, float* latents /*[<= m/2 + 1, d]*/);

/// Ratio-1 compressor: latents[r] = RMSNorm(Wkv x[r]) (raw, pre-RoPE).
void compress_ratio1(const float* x /*[m, in]*/, int m, const bf16_weight& wkv,
                     const float* norm, float eps, float* latents /*[m, d]*/);

/// Indexer scores: score[r, j] = sum_h w[r, h] * relu(q[r, h] . k[j]) for j < num_visible[r],
/// -inf for the rest. fp32 accumulation, fixed order.
void index_scores(const float* q,      // [m, heads, dim]
                  const float* w,      // [m, heads]
                  int m, int heads, int dim,
                  const float* keys,   // [num_keys, dim]
                  int num_keys, const int32_t* num_visible /*[m]*/,
                  float* scores);      // [m, num_keys]

/// Top-k per row of scores [m, n] (ties to the lowest index), -inf entries never chosen,
/// written in ascending index order and padded with -1: out [m, k].
void topk_indices(const float* scores, int m, int n, int k, int32_t* out);

/// Level-1 candidate blocks: block score = max of each block of `block` entries; the block of
/// each row's newest visible entry (num_visible[r]-1) is always kept; keep `keep` blocks
/// (ties to the lowest block). mask [m, ceil(n/block)] = 1 for kept blocks.
void candidate_blocks(const float* scores, int m, int n, int block, int keep,
                      const int32_t* num_visible, uint8_t* mask);

// ---- MoE ----------------------------------------------------------------------------------

struct expert_weights {
  fp4_weight w1, w3, w2;  ///< gate [inter, d], up [inter, d], down [d, inter]
};
struct shared_expert_weights {
  fp8_weight w1, w3, w2;
};

/// Routing (noaux_tc, sqrt-softplus): s = sqrt(softplus(Wg y)) (fp32); sel = top-k of s + bias
/// (ties to the lowest expert); weights = s[sel] / (sum s[sel] + 1e-20) * route_scale.
void moe_route(const float* y /*[m, d]*/, int m, const bf16_weight& gate,
               const float* bias /*[num_experts]*/, int topk, float route_scale,
               int32_t* sel /*[m, topk]*/, float* weights /*[m, topk]*/);

/// Adds to out[r] the SwiGLU expert output scaled by weight[r] (scale applied before W2):
/// h = silu(min(W1 y, limit)) * clamp(W3 y, -limit, limit); out += W2 (weight * h).
void expert_ffn_fp4(const float* y /*[m, d]*/, int m, const expert_weights& e,
                    const float* weight /*[m]*/, float limit, float* out /*[m, d]*/);
/// The shared expert: same SwiGLU with FP8 weights, weight 1, added to out.
void expert_ffn_fp8(const float* y, int m, const shared_expert_weights& e, float limit,
                    float* out);

/// The whole MoE output of m rows (spec §2.7 steps 4-6): out[r] = sum_i (expert sel[r, i]
/// scaled by weights[r, i]), added in top-k order, plus the shared expert, in fp32 (out is
/// overwritten, not rounded). Each selected expert runs once over the rows routed to it.
/// experts[e] with null w1.data (held by another shard) adds nothing; shared may be null.
void moe_ffn(const float* y /*[m, d]*/, int m, int d, const int32_t* sel /*[m, topk]*/,
             const float* weights /*[m, topk]*/, int topk,
             const expert_weights* experts /*[num_experts]*/, int num_experts,
             const shared_expert_weights* shared, float limit, float* out /*[m, d]*/);

// ---- Engram -------------------------------------------------------------------------------

/// Table parameters of one Engram layer (spec §2.8).
struct engram_hash_params {
  int max_ngram = 4;                 ///< n-gram sizes 2..max_ngram
  int num_heads = 8;
  int64_t multipliers[8] = {};       ///< odd int64, one per look-back distance (max_ngram used)
  int64_t primes[32] = {};           ///< [(max_ngram-1) * num_heads], (n, head) order
  int64_t offsets[32] = {};          ///< first row of each (n, head) range
  int32_t pad_id = 2;                ///< compressed id used for slots before the sequence start
  /// Token id -> compressed id (the tokenizer-derived map, spec §2.8); null: the identity.
  std::shared_ptr<const std::vector<int32_t>> token_map;
};

/// What fixes the Engram hashes of a model (its config plus the tokenizer-derived map).
struct engram_hash_config {
  std::vector<int> layer_ids;
  int max_ngram = 4;
  int heads = 8;
  int64_t vocab_size = 16000000;    ///< engram_vocab_size: the first prime is the smallest >= it
  int64_t compressed_vocab = 99092; ///< engram_compressed_vocab_size: bounds the multipliers
  int32_t pad_token = 2;            ///< engram_pad_token_id, a token id (mapped like any other)
  std::shared_ptr<const std::vector<int32_t>> token_map;  ///< null: identity
};

/// Hash parameters of each Engram layer, in layer_ids order. With a token map, as the
/// checkpoint's reference computes them: layer L's multipliers are 2r+1 for the first max_ngram
/// draws r of numpy's default_rng(10007 * L).integers(0, (INT64_MAX / compressed_vocab) / 2);
/// without one (a bare config, token ids hashed as they are), splitmix64(10007 * L) | 1. Primes
/// are the successive primes >= vocab_size, taken layer after layer in (n, head) order; offsets
/// are the running sum of the layer's earlier primes; pad_id is the pad token's compressed id.
std::vector<engram_hash_params> engram_default_params(const engram_hash_config& c);

/// Rows of a layer's Engram table: the sum of its (max_ngram-1)*num_heads primes.
int64_t engram_table_rows(const engram_hash_params& p);

/// Row ids [m, (max_ngram-1)*num_heads] for tokens at positions [first, first+m) of a
/// sequence of token ids ids[0..first+m), mapped through p.token_map (look-back stops at 0).
void engram_rows(const int32_t* ids, int64_t first, int m, const engram_hash_params& p,
                 int64_t* rows);

struct engram_weights {
  const uint8_t* table = nullptr;        // [rows, head_dim] e4m3
  const uint8_t* table_scale = nullptr;  // [rows, head_dim/32] ue8m0
  int64_t num_rows = 0;
  int head_dim = 0;
  fp8_weight wkv;                        // [(hc+1)*d, rows_per_token*head_dim]
  const float* q_weight = nullptr;       // [hc, d]
  const float* k_weight = nullptr;       // [hc, d]
};

/// X[r, h] += gate_h * value for every copy h (result rounded to bf16), spec §2.8.
void engram(float* X /*[m, hc, d]*/, int m, int hc, int d, const int64_t* rows,
            int rows_per_token, const engram_weights& w, float eps);

// ---- embedding, head, sampling ------------------------------------------------------------

/// out[r] = bf16 row tokens[r] of the table, as fp32.
void embed(const int32_t* tokens, int m, const bf16_weight& table, float* out /*[m, d]*/);

}  // namespace cedar::cpu
