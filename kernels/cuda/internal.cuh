// Building blocks shared by the CUDA op files: strided linear layers over already-quantized
// activations, row fake-quant and small elementwise steps. All on the current stream.
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"
#include "kernels/weights.hpp"

namespace cedar::cuda::detail {

/// y[r * ldy + n] = dot(x[r * ldx], W[n]) in dot_order for r < m, n < w.out. x is taken as
/// given (callers fake-quantize it first for the FP8/FP4 weights).
void gemm_fp8(const float* x, int ldx, int m, const fp8_weight& w, float* y, int ldy);
void gemm_fp4(const float* x, int ldx, int m, const fp4_weight& w, float* y, int ldy);
void gemm_bf16(const float* x, int ldx, int m, const bf16_weight& w, float* y, int ldy);
void gemm_f32(const float* x, int ldx, int m, const float* w, int out, int in, float* y, int ldy);

/// The intermediate size the present experts share (0 when this shard holds none), after
/// checking that each takes and gives d (moe_ffn's contract, exact and fast sets).
int expert_inter(const cpu::expert_weights* experts, int num_experts, int d);

/// xq [m, in] = FP8 fake-quant (per 32) of x rows [m, ldx].
void quant_rows_fp8(const float* x, int ldx, int m, int in, float* xq);

/// emb [n, w.head_dim] = the dequantized Engram table rows rows[0, n) (an id outside the table
/// traps), on the current stream.
void engram_gather(const cpu::engram_weights& w, const int64_t* rows, long long n, float* emb);

/// The RoPE frequencies of p (rope_dim / 2 of them), exactly cpu::rope_frequencies.
void rope_frequencies(const cpu::rope_params& p, double* freqs);

/// out[i] = 0 + a[i] (the CPU's `zeroed buffer += a`), or out[i] += a[i].
void add_into(float* out, const float* a, long long n);

}  // namespace cedar::cuda::detail
