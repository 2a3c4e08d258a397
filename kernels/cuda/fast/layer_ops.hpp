// Fused per-layer steps of the fast kernel set: the mHC boundary between two sublayers (HCPost
// of the one before, HCMix with Sinkhorn of the next, HCCollapse and RMSNorm) in two launches,
// and the MoE router (gate product, then sqrt-softplus, bias, top-k, weights) in two. Same
// semantics as the exact ops of kernels/cuda (cuda_ops.hpp: hc_post, hc_mix, hc_collapse,
// rmsnorm, moe_route); sums run in another order, so results agree within fp32 rounding, and a
// router tie closer than that may pick another expert. Also the Engram step, a row gather,
// greedy sampling, and a decode row's chain of small steps in one launch (the separate ops'
// bits). Plain C++ header, CUDA builds only.
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"
#include "kernels/weights.hpp"

namespace cedar::cuda::fast {

#ifdef CEDAR_HAVE_CUDA

struct expert_plan;  // fast_ops.hpp

/// The HCMix weights of one sublayer (device arrays) and its constants.
struct hc_mix_params {
  const float* fn = nullptr;     // [hc * hc + 2 * hc, hc * d] fp32
  const float* scale = nullptr;  // [3]
  const float* base = nullptr;   // [hc * hc + 2 * hc]
  int sinkhorn_iters = 0;
  float hc_eps = 0, norm_eps = 0;
};

/// How hc_boundary runs: one launch for a single row (d <= 16384; `cedar kernel-lab --op mhc`:
/// at 2 rows and more, two launches are as fast or faster), two above; or either, for the
/// kernel lab and the tests (the same bits).
enum class hc_launches { automatic, one, two };
constexpr int hc_one_launch_max_rows = 1;
constexpr int hc_one_launch_capacity = 8;  ///< rows hc_launches::one takes

/// One sublayer boundary for m rows of the residual X [m, hc, d] (device arrays):
///  1. if f != null: X <- hc_post(f [m, d], X, post, comb) (the previous sublayer's output);
///  2. pre_out, post, comb <- hc_mix(X, mix) (post and comb are overwritten after step 1 read them);
///  3. x_out [m, d] <- rmsnorm(hc_collapse(X, collapse_pre [m, hc]), norm_w, mix.norm_eps).
/// collapse_pre must not alias pre_out. One or two launches; no host synchronization. codes /
/// scales, when given ([m, d], [m, d / 32]; d % 32 == 0): also quantize_rows_fp8 of x_out, for
/// the FP8 linears that read it.
void hc_boundary(float* X, int m, int hc, int d, const float* f, float* post /*[m, hc]*/,
                 float* comb /*[m, hc, hc]*/, const hc_mix_params& mix, float* pre_out /*[m, hc]*/,
                 const float* collapse_pre, const float* norm_w /*[d]*/, float* x_out,
                 hc_launches launches = hc_launches::automatic, uint8_t* codes = nullptr, float* scales = nullptr);

/// cuda::moe_route in two launches: s = sqrt(softplus(y gate^T)), top-k of s + bias (ties to the
/// lowest expert), weights = s[sel] / sum * route_scale. gate.out <= 1024, topk <= 16.
/// plan (experts and buffer set): where route_makes_plan(m, topk), the top-k launch also groups
/// the slots by expert for moe_ffn (fast_ops.hpp, expert_plan), and sets plan's rows and topk.
void moe_route(const float* y /*[m, gate.in]*/, int m, const bf16_weight& gate, const float* bias, int topk,
               float route_scale, int32_t* sel /*[m, topk]*/, float* weights /*[m, topk]*/,
               expert_plan* plan = nullptr);

/// cuda::engram with the fast kernel set: the table rows gathered and dequantized, the wkv
/// product by fast::linear_fp8, and each (row, copy)'s gate from block-parallel sums (another
/// order than the CPU's serial ones). rows: device [m, rows_per_token].
void engram(float* X /*[m, hc, d]*/, int m, int hc, int d, const int64_t* rows, int rows_per_token,
            const cpu::engram_weights& w, float eps);

/// The steps finish_rows applies to each row, in this order; each is skipped when its pointer
/// is null (fake_fp8: when false).
struct row_finish {
  const float* norm_w = nullptr;  ///< [d]: rmsnorm with eps (cuda::rmsnorm)
  float eps = 0;
  const int32_t* positions = nullptr;      ///< [m]: RoPE of the last rope->rope_dim values (cuda::rope,
  const cpu::rope_params* rope = nullptr;  ///< one head of d)
  float* rope_cs = nullptr;  ///< [m, rope_dim]: each row's cos (first half) and sin, cuda::rope's values
  /// [m, rotate_heads, rotate_head_dim]: also RoPE of each head's last rope_dim values at the
  /// row's position (cuda::rope), by more blocks of the launch
  float* rotate = nullptr;
  int rotate_heads = 0, rotate_head_dim = 0;
  bool fake_fp8 = false;                   ///< cuda::fake_quant_fp8_rows
  uint8_t* record = nullptr;               ///< [m, d + d / 32]: cuda::pack_fp8_rows of the result
  uint8_t* codes = nullptr;                ///< [m, d], scales [m, d / 32]: quantize_rows_fp8 of the
  float* scales = nullptr;                 ///< result (the next FP8 linear's activation)
};

/// y [m, d] (may be x) = the steps of f on the rows of x, in one launch (a block per row, d <=
/// 8192): the bits of the separate ops, for the decode chain where each launch costs more than
/// its work.
void finish_rows(const float* x, int m, int d, const row_finish& f, float* y);

/// finish_rows of two chains of the same m rows in one launch (the bits of two calls): (x0, d0,
/// f0, y0) and (x1, d1, f1, y1); the second rotates nothing (f1.rotate null).
void finish_rows_pair(int m, const float* x0, int d0, const row_finish& f0, float* y0, const float* x1, int d1,
                      const row_finish& f1, float* y1);

/// dst[i, :] = src[rows[i], :] for i < m; rows is a device array, width floats per row.
void gather_rows(const float* src, const int32_t* rows, int m, int width, float* dst);

/// Greedy sampling of m rows in one launch: tokens[r] = argmax of logits row r (ties to the
/// lowest id, as cuda::argmax_rows) and logprobs[r] its log-softmax (the sum of exponentials in
/// double, in another order than the host sampler's: within 1e-6).
void greedy_rows(const float* logits /*[m, vocab]*/, int m, int vocab, int32_t* tokens /*[m]*/,
                 float* logprobs /*[m]*/);

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda::fast
