// Tensor-core linear layers of the CUDA backend (mma.sync e4m3, sm_90) and the device helpers of
// `cedar kernel-lab`. Plain C++ header; everything here exists only in a CUDA build.
//
// Numerics: the activation is quantized exactly as fmt::quantize_fp8 (codes + power-of-two scale
// per 32), every 32-wide K block is one tensor-core product of exact e4m3 x e4m3 terms, and the
// block sums are scaled (powers of two, exact) and added in fp32 in ascending K. So the result
// equals the CPU op's up to the order and precision of the fp32 sums: the lab checks
// |y - y_cpu| <= 2^-10 * sum_k |xq_k * w_k| per output and reports the worst ratio. A row's
// result never depends on the other rows (fixed tiles, fixed K order): batch-invariant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/ops.hpp"
#include "kernels/weights.hpp"

namespace cedar::cuda::fast {

#ifdef CEDAR_HAVE_CUDA

/// Tile shapes of the tensor-core GEMM (rows of W x tokens per block):
/// gemv (weight read straight into fragments, 128-wide K chunks summed by a second pass;
/// m <= 8, or 16 at a cost); pipelined: narrow 64x8, narrow16 32x16 and narrow32 64x32 (weight streams for a
/// few slots per expert), split4 and split8 16x8 (K over 4 or 8 warps of the block: weights of few
/// rows and long K at decode), skinny 32x64 (m <= 64) and wide 128x128 (prefill).
/// stream: up to 8 slots a group, 16 weight rows a warp straight from HBM, one mma chain a K
/// block for every slot (gemm_stream.cu); its own summation order, so not the other tiles' bits
/// (batch-invariant up to 8 rows all the same).
enum class tile_kind { gemv, narrow, narrow16, narrow32, split4, split8, skinny, wide, stream };
/// Slots a group (rows of a dense call) the stream tile takes at most.
inline constexpr int stream_max_slots = 8;
/// Shapes the stream tile takes: n % 16 == 0, k a multiple of its step (FP4 256, FP8 128).
inline bool stream_shape(bool fp4, int n, int k) { return n % 16 == 0 && k % (fp4 ? 256 : 128) == 0; }
/// Whether the stream tile's shared memory (x staged for up to `slots` slots over all of K) fits
/// a block on the current device: up to 8 slots at K 2048 (the model's weights) it does; 8 slots
/// at K 8192 (wo_b) need 256 KB and do not.
bool stream_fits(bool fp4, int slots, int k);
/// Every tile of one summation order, in the order above (the lab's tables and the tests go
/// through them all; stream, of its own order, is not among them).
inline constexpr tile_kind all_tiles[] = {tile_kind::gemv,     tile_kind::narrow, tile_kind::narrow16,
                                          tile_kind::narrow32, tile_kind::split4, tile_kind::split8,
                                          tile_kind::skinny,   tile_kind::wide};
const char* tile_name(tile_kind t);
/// The tile the library picks for m rows.
tile_kind pick_tile(int m);
/// Blocks of a dense FP8 set (gemm_fp8_set) on split4 or split8, 16 output rows each, that the
/// current device holds at once: a set of more runs a second wave.
int set_blocks_at_once(tile_kind t);
/// Outputs (of 128 a warp) where the tiles' mma (mma.cuh: mma_e4m3, written out as two f16
/// products) and the e4m3 m16n8k32 instruction give different bits, over `warps` random trials.
long long mma_form_mismatches(int warps, uint64_t seed);
/// Shapes the gemv tile takes: n % 16 == 0 and k % 32 == 0.
inline bool gemv_shape(int n, int k) { return n % 16 == 0 && k % 32 == 0; }
/// The tiles that have a form on x's pairs (fp4_x_pairs): the narrow ones; others read the codes.
inline bool takes_x_pairs(tile_kind t) {
  return t == tile_kind::narrow || t == tile_kind::narrow16 || t == tile_kind::narrow32;
}

/// codes [m, k] e4m3 and scales [m, k/32] (powers of two) of x [m, k]; k % 32 == 0.
void quantize_rows_fp8(const float* x, int m, int k, uint8_t* codes, float* scales);

/// y [m, w.out] = W x for FP8-quantized x (codes, scales as quantize_rows_fp8 writes them).
/// Needs w.out % 128 == 0 and w.in % 256 == 0 (gemv: w.out % 16 == 0, w.in % 32 == 0). Every
/// tile gives the same bits.
void gemm_fp8(const uint8_t* xq, const float* xs, int m, const fp8_weight& w, float* y, tile_kind t);
/// gemm_fp8 for `count` (1 to 4) weights of one x (the same w->in) on the gemv, split4 or split8
/// tile: one launch for all of them (the gemv tile: and one chunk-sum launch); each y[i] gets the
/// bits gemm_fp8 gives it.
void gemm_fp8_set(const uint8_t* xq, const float* xs, int m, int count, const fp8_weight* const* w, float* const* y,
                  tile_kind t);
/// As gemm_fp8 with a W4A8 weight (E2M1 turned into e4m3 in registers).
void gemm_fp4(const uint8_t* xq, const float* xs, int m, const fp4_weight& w, float* y, tile_kind t);

/// One expert's share of a grouped W4A8 product.
struct expert_group {
  const uint8_t* w = nullptr;      // [n, k/2] packed e2m1 (device)
  const uint8_t* scale = nullptr;  // [n, k/32] ue8m0 (device)
  int first_slot = 0;              ///< its slots are slot_rows[first_slot, first_slot + num_slots)
  int num_slots = 0;
};

/// The routed slots of a batch grouped by expert, as moe_ffn's grouping launch leaves them, made
/// by moe_route's top-k launch where that launch is one block (up to 8 rows): moe_ffn then starts
/// at the products, one launch a layer less at decode, with the same groups (so the same bits).
/// The caller sets experts and num_experts (moe_ffn's host array of the layer) and buffer
/// (device memory of expert_plan_bytes(m, topk, num_experts), alive until moe_ffn has run);
/// moe_route sets rows and topk when it wrote the plan, and leaves them 0 when it did not (then
/// moe_ffn groups the slots itself); table is the device copy of experts it grouped over.
struct expert_plan {
  const cpu::expert_weights* experts = nullptr;
  int num_experts = 0;
  void* buffer = nullptr;
  int rows = 0, topk = 0;
  const cpu::expert_weights* table = nullptr;
};
std::size_t expert_plan_bytes(int m, int topk, int num_experts);
/// Whether moe_route at m rows and topk writes an expert plan (tuning::expert_plan_in_route).
bool route_makes_plan(int m, int topk);

namespace detail {
/// The arrays of a plan's buffer (moe_ffn's grouping): for the slots sorted by expert,
/// slot_src[p] the slot, slot_row[p] its row, iota[p] = p; slot_pos[slot] its place (-1: no
/// expert here); the three matrices' groups, compacted (experts with slots first, in expert
/// order); counts [num_experts] slots an expert, and *total.
struct plan_arrays {
  int32_t *slot_src, *slot_row, *iota, *slot_pos;
  expert_group *g1, *g3, *g2;
  int *counts, *total;
};
plan_arrays plan_layout(void* buffer, int m, int topk, int num_experts);
/// The device copy of a host table of expert views (uploaded once per table and device).
const cpu::expert_weights* expert_table(const cpu::expert_weights* experts, int num_experts);
}  // namespace detail

/// x's codes and scales [rows, k] (k % 128 == 0) as the W4A8 narrow tiles' mma operand, made
/// once for every weight that takes this x: pairs [rows, k] f16 in the tiles' K order, a K
/// block's values times 2^(e_b - e_c + 7) (2^e_b its scale, 2^e_c the largest of its 128-wide
/// summation chunk's four), and factors [rows, k / 128] = 2^(e_c - 1). With them the tiles
/// neither convert x nor multiply by its scale in every product, and give the same bits (the
/// scales are powers of two) unless a block's scale is below 2^-22 of its chunk's largest: its
/// smallest codes (2^-9) would then fall under f16's 2^-24 and round.
void fp4_x_pairs(const uint8_t* xq, const float* xs, int rows, int k, uint16_t* pairs, float* factors);

/// Grouped W4A8: for every group g and each of its slots s, y[s] = W_g x[slot_rows[s]].
/// groups is a DEVICE array of num_groups whose slot ranges lie in [0, total_slots);
/// slot_rows a device array; max_slots bounds every num_slots. All experts share n and k.
/// pairs / factors: x's fp4_x_pairs, or null; the narrow tiles read them when given.
void grouped_fp4(const uint8_t* xq, const float* xs, const int32_t* slot_rows /*[total_slots]*/,
                 const expert_group* groups, int num_groups, int total_slots, int max_slots, int n,
                 int k, float* y /*[total_slots, n]*/, tile_kind t, const uint16_t* pairs = nullptr,
                 const float* factors = nullptr);

/// Two grouped products of one x and one slot table (an expert's w1 and w3): one launch of the
/// tiled kernels (two with the gemv tile); each output gets the bits grouped_fp4 gives it.
void grouped_fp4_pair(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups_a,
                      const expert_group* groups_b, int num_groups, int total_slots, int max_slots, int n, int k,
                      float* y_a, float* y_b, tile_kind t, const uint16_t* pairs = nullptr,
                      const float* factors = nullptr);

/// The tiles that take SwiGLU into grouped_fp4_swiglu: the narrow one (64 rows a block).
inline bool swiglu_in_tile(tile_kind t) { return t == tile_kind::narrow; }

/// An expert's w1 and w3 products of grouped_fp4_pair and the SwiGLU after them in one launch,
/// on the narrow tile (swiglu_in_tile): each block takes the same 32 outputs of both, so h =
/// silu(min(g, limit)) * clamp(u, +-limit) times route_weights[slot_src[p]] (when given) at
/// sorted slot p is one FP8 group, written as codes hq [total_slots, n] and scales hs
/// [total_slots, n / 32]: the bits of the pair, then experts_fast.cu's SwiGLU and quantization.
/// Slots in no group are not written.
void grouped_fp4_swiglu(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups_1,
                        const expert_group* groups_3, int num_groups, int total_slots, int max_slots, int n, int k,
                        tile_kind t, const int32_t* slot_src, const float* route_weights, float limit, uint8_t* hq,
                        float* hs, const uint16_t* pairs = nullptr, const float* factors = nullptr);

// ---- the fast kernel set's ops (linear_fast.cu): the contracts of the cuda:: ops ---------------
//
// Few rows: the gemv tile (FP8, W4A8; experts grouped on the device) and a bf16 GEMV; many rows:
// weights dequantized into a bf16 scratch and a cuBLAS bf16 GEMM (fp32 accumulation), the same
// exact products as the CPU op summed in another order (linear_fast.cu says why). Rows below the
// thresholds are batch-invariant (fixed summation order); the cuBLAS path is not (cuBLAS picks
// its algorithm by m), and the experts there copy the per-expert counts to the host. Below the
// bf16 threshold the experts run grouped on the device: the narrow weight stream (64 rows x 8
// or 32 rows x 16 slots), then the skinny tile (same summation order).

/// Row counts up to which the decode kernels run (inclusive); above: the bf16 GEMM path.
/// Measured (`cedar kernel-lab --op prefill`, H200): attn.wo_b 5120x8192 FP8 gemv 43 / 85 / 167 us
/// at m = 16 / 32 / 64 against 79 / 80 / 84 us for the bf16 path; W4A8 expert w13 gemv 28 / 52 /
/// 110 us; so the tile runs up to 32 rows. The experts (64 x top-6 + shared, one layer, same
/// lab, "moe_prefill"): the grouped narrow stream 1.83 / 3.12 / 5.67 ms at 128 / 256 / 512
/// tokens, the skinny tile 3.41 / 3.62 / 4.00 ms, dequant + cuBLAS 5.14 / 5.30 / 5.47 / 6.19
/// (1024) ms; so narrow up to 256 tokens, skinny to 512, then the bf16 path. Narrow's 16-slot
/// pass (`--op moe`, up + down): 1.15 against 0.95 ms at 64 tokens (~6 slots per expert), 2.37
/// against 2.78 ms at 256 (~24); the switch at 128 tokens (two 8-slot passes) is not swept.
/// Those figures predate the tiles' once-per-block stage sources (f1315ea); after it (`--op
/// moe`, up + down, us): 64 tokens narrow 596, narrow16 665, skinny 2,458; 256 tokens narrow
/// 1,699, narrow16 1,350, skinny 2,497. With the 64-row narrow tile and narrow32 (64 rows x 32
/// slots, `--op moe --tokens N --tile T`, up + down, us): 128 tokens narrow 944, narrow16 766,
/// narrow32 950; 160: 1,124 / 932 / 952; 192: 1,290 / 1,108 / 954; 256: 1,646 / 1,364 / 998;
/// narrow32 against skinny at 384 / 512: 1,646 / 1,901 against 2,533 / 2,567; narrow against
/// narrow16 at 64 / 80 / 96 / 112 tokens: 558 / 650 / 752 / 850 against 668 / 672 / 686 / 732.
/// So narrow up to 80 tokens, narrow16 to 160, narrow32 to 512 (the skinny tile is left to the
/// lab); the bf16 path past 512 was not swept against narrow32. On x's pairs (fp4_x_pairs, from
/// 2 tokens; 2026-11-30, up + down, us): narrow against narrow16 at 48 / 64 / 80 / 96 tokens
/// 388 / 440 / 500 / 580 against 604 / 609 / 611 / 618; narrow16 against narrow32 at 128 / 160 /
/// 192 / 256: 675 / 828 / 995 / 1,221 against 807 / 810 / 814 / 853. So narrow now up to 96.
struct tuning {
  int gemv_max_rows = 32;           ///< FP8 / W4A8 linears: gemv tile
  int bf16_gemv_max_rows = 16;      ///< bf16 linears and wo_a: the bf16 GEMV
  int expert_gemv_max_rows = 512;   ///< routed experts (tokens): the grouped narrow streams
                                    ///< (the gemv tile where d or inter is not a multiple of 256)
  int expert_tiled_max_rows = 512;  ///< above that: the grouped W4A8 skinny tile, all on the
                                    ///< device (no dequant pass, no host round trip); above: bf16
  int expert_narrow_max_rows = 96;  ///< within expert_gemv_max_rows: 8 slots a narrow pass up
                                    ///< to here, then 16 (last: brace-initialized tunings keep it)
  int expert_narrow16_max_rows = 160;  ///< then 32 slots a pass (narrow32)
  /// Dense FP8 / W4A8 linears past gemv_max_rows up to fp8_narrow_max_rows rows whose weight
  /// has at least fp8_narrow_min_weight elements (and no bf16 copy kept): the narrow32 tile, one
  /// weight pass per 32 rows, in place of the per-call bf16 dequantization. `--op linear_fp8` at
  /// m = 64 (us): narrow32 wq_b 42.9, wo_b 57.1, shared.w1 23.4, shared.w2 18.1 against the bf16
  /// path's 84 for wo_b; the small wq_a / wkv did no better than the other paths, so they stay.
  int fp8_narrow_max_rows = 64;
  long long fp8_narrow_min_weight = 8ll << 20;
  /// Dense FP8 / W4A8 linears at up to 8 rows (one pass of the narrow tile) with at least this
  /// many outputs (80 blocks of 64 rows): the narrow tile in place of the gemv tile (the same
  /// bits). `--op linear_fp8 --quick` at m = 1 (us, gemv -> narrow): wq_b 22.0 -> 15.7,
  /// shared.w2 9.2 -> 8.1, 5120 x 5120 16.0 -> 15.2, wo_b 22.9 -> 22.6; below, wq_a (1280 outputs)
  /// 7.6 -> 14.6 and shared.w1 (2304) 9.3 -> 14.9, too few blocks.
  int dense_stream_min_out = 5120;
  /// Dense FP8 / W4A8 linears at up to 8 rows with K >= split_min_k and at least split_min_out
  /// outputs: the split4 tile (16 rows a block, K over 4 warps; the same bits); sets of one x
  /// (linear_fp8_set) with K >= split_min_k: the split8 tile. `--op linear_fp8 --quick` at m = 1
  /// (us, gemv / narrow / split4 / split8): wo_b 23.2 / 22.7 / 17.7 / 21.1, 5120 x 5120 16.1 /
  /// 15.3 / 12.8 / 15.0, shared.w2 9.2 / 8.1 / 7.7 / 9.4, wq_a 7.6 / 14.6 / 7.7 / 6.5, shared.w1
  /// 9.4 / 15.4 / 9.4 / 8.6; wq_b (K = 1280) 22.1 / 15.6 / 20.0 / 24.7 stays on narrow. Batch-1
  /// decode of bench-40L-E64: 12.84 ms a step before, 12.79 with split4, 12.52 with the sets too.
  int split_min_k = 2048;
  int split_min_out = 4096;
  /// Dense FP8 linears at up to 8 rows with K <= stream_max_k and at least stream_min_out
  /// outputs: the stream tile (its own summation order; a warp reads 16 rows over all of K, so
  /// it needs many rows and a short K). `--op linear_fp8 --shape attn.wq_b` (32768 x 1280, us,
  /// narrow / stream): 16.30 / 11.50 at m = 1, 17.39 / 20.67 at m = 8 (4 column passes); the
  /// stream stays on at every m <= 8 so that a row's bits never depend on m. Decode step of
  /// bench-40L-E64 (ms, stream on / off): 8.92 / 9.06 at batch 1, 22.36 / 22.07 at batch 8.
  int stream_max_k = 2048;
  int stream_min_out = 16384;
  /// Rows up to which those weights take the stream tile: every m it takes, so that a row's bits
  /// never depend on m. With $CEDAR_GPU_BATCH_INVARIANT=0, 2 (one column pass; narrow's 17.39
  /// against the stream's 20.67 us at 8 rows).
  int stream_max_rows = stream_max_slots;
  /// Rows up to which the fused attention (per-16-heads kernel) splits a row's candidates over
  /// blocks as it does for a row alone, so that a row's bits do not depend on the rows beside it
  /// (past it the split count follows the batch: fewer, longer splits once the blocks fill the
  /// device). With $CEDAR_GPU_BATCH_INVARIANT=0, 0.
  int attention_split_rows = stream_max_slots;
  /// Routed experts: tokens up to which the grouped stream tile runs in place of narrow. Off by
  /// default (its own summation order: a token's bits would change between 2 and 3 tokens);
  /// with $CEDAR_GPU_BATCH_INVARIANT=0, 2: `--op moe --tile narrow|stream` (us, up / down) 39.3 /
  /// 20.2 against 31.3 / 17.1 at one token, 59.9 / 33.5 against 53.6 / 30.3 at two.
  int expert_stream_max_rows = 0;
  /// Routed experts past expert_tiled_max_rows tokens on sm_90a: one wgmma launch per matrix for
  /// all experts, FP4 turned into bf16 in shared memory (experts_wg.cu), instead of a bf16 copy
  /// of each expert's weights and a cuBLAS product per expert.
  bool expert_wgmma = true;
  /// Tokens a block of those takes (16, 32, 64, 128 or 256; 0: by the rows an expert has on
  /// average; $CEDAR_GPU_EXPERT_WG_TILE). A row's bits do not depend on it.
  int expert_wg_tile = 0;
  /// The wgmma experts (where they run) from this many tokens on, in place of the grouped tiles.
  /// `--op prefill`, µs a layer, narrow / best wgmma tile: 64 tokens 551 / 716, 96 748 / 719,
  /// 112 822 / 725, 128 879 / 753, 256 1,062 / 806. 97: the grouped tiles keep up to 96 tokens,
  /// so the routed experts give a row its bits in any decode batch of up to 96 rows (the tiles
  /// sum in other orders; the rest of the step is batch-invariant up to 8 rows). Decode of bench-40L-E64 (ms a step, 129 / 97): batch 112 54.13 / 50.62, 128 56.28 /
  /// 52.50; a window's 128 rows (the truncated layers, a prefix hit's replay) take it too, under
  /// the same CUDA graphs.
  int expert_wg_min_rows = 97;
  /// Routed experts from this many tokens on: the narrow tiles read x's and h's pairs
  /// (fp4_x_pairs, one launch each). `--op moe`, up / down, codes -> pairs (us): 1 token 36.19 /
  /// 19.12 -> 36.50 / 18.57, 2 tokens 59.15 / 32.94 -> 51.80 / 29.42; decode at batch 1 8.61
  /// against 8.74 ms with pairs from 1. $CEDAR_GPU_EXPERT_PAIRS_FROM sets it (A/B runs; 0: never).
  int expert_pairs_min_rows = 2;
  /// Routed experts on the narrow tile: SwiGLU and h's FP8 codes in the w1 | w3 launch
  /// (grouped_fp4_swiglu), one launch a layer less. $CEDAR_GPU_SWIGLU_IN_TILE=0 turns it off
  /// (A/B runs).
  bool expert_swiglu_in_tile = true;
  /// The bf16 GEMV (bf16 linears, wo_a) from this many rows: x staged in shared memory, 4
  /// columns a warp (gemv_staged_kernel; the same bits). `--op gemv`, µs staged / plain at 2
  /// and 8 rows: head 321 / 377 and 547 / 1,533, wo_a's FP8 form 18.2 / 23.2 and 36.8 / 96.5;
  /// decode at batch 8 18.09 against 20.88 ms. $CEDAR_GPU_GEMV_STAGED_FROM sets it (A/B runs;
  /// 0: never).
  int gemv_staged_min_rows = 2;
  /// The bf16 GEMV's column and split modes (one row: wo_a, the router gate, the head) load a
  /// lane's first pieces of the weight before the dependency wait, so that the weight starts
  /// streaming while the kernels before it end. $CEDAR_GPU_GEMV_EARLY=0 turns it off (A/B runs).
  bool gemv_weight_early = true;
  /// The one-row GEMV's columns a warp in its column mode (wo_a, the head): 1, gemv_bf16_kernel's
  /// one column a warp, or 2 / 4 (gemv_cols_kernel: x loaded once for them, more weight in
  /// flight a lane; the same bits), with gemv_one_row_unroll (2 or 4) pieces of each column in
  /// flight. `--op gemv --tokens 1`, µs, 1 / 2x2 / 2x4 / 4x2 / 4x4: wo_a's FP8 form 18.46 /
  /// 12.24 / 14.65 / 11.48 / 15.20, its bf16 form 21.44 / 17.73 / 24.89 / 18.55 / 26.51, the head
  /// 297 / 297 / 295 / 299 / 298; decode at batch 1 8.23-8.25 ms (4x2) against 8.47-8.59 (1).
  /// $CEDAR_GPU_GEMV_COLS=C[xU] sets them (A/B runs).
  int gemv_one_row_cols = 4;
  int gemv_one_row_unroll = 2;
  /// At one row, wo_a's GEMV (4 columns a warp) also writes wo_b's FP8 codes of its outputs, one
  /// launch less a layer (gemv_fp8w_codes): decode at batch 1 8.16-8.17 against 8.29-8.34 ms.
  /// $CEDAR_GPU_GEMV_CODES=0 turns it off (A/B runs).
  bool gemv_codes = true;
  /// The one-launch mHC boundary (one row) loads its block's HCMix weights before the dependency
  /// wait. $CEDAR_GPU_BOUNDARY_EARLY=0 turns it off (A/B runs).
  bool boundary_weight_early = true;
  /// The one-launch mHC boundary leaves the row's finish (the partials' sums, Sinkhorn, the
  /// normalized input and its codes) to mix_finish, whose blocks share it, in place of its last
  /// block and the quantization launch after it (the same bits, the same launch count). Decode
  /// of bench-40L-E64 on one H200 at batch 1: 7.99-8.05 against 8.07-8.14 ms a step.
  /// $CEDAR_GPU_BOUNDARY_FINISH=0 turns it off (A/B runs).
  bool boundary_finish_apart = true;
  /// In a graph capture, that finish's Sinkhorn block (pre, post and comb, which the next
  /// boundary reads) runs as a branch on the side lane while the step goes on (the same bits).
  /// Decode of bench-40L-E64 on one H200 at batch 1: 7.66-7.72 against 8.00 ms a step.
  /// $CEDAR_GPU_BOUNDARY_BRANCH=0 turns it off (A/B runs).
  bool boundary_sinkhorn_branch = true;
  /// Decode rows whose attention runs the per-16-heads kernel: that kernel rotates the queries
  /// as it loads them, so the kv row chain joins the qr chain's launch before wq_b and the
  /// launch after wq_b is gone (the same bits: tests/gpu/decode_graph_test.cpp compares the
  /// logits). bench-40L-E64, one H200: 8.17-8.21 against 8.28-8.32 ms a step at batch 1,
  /// 17.40-17.59 against 17.58-17.84 at batch 8. $CEDAR_GPU_ATTENTION_ROTATES_Q=0 turns it off
  /// (A/B runs).
  bool attention_rotates_q = true;
  /// Up to 8 decode rows: the router's top-k launch also groups the routed slots by expert
  /// (expert_plan; the expert table read before its dependency wait), and moe_ffn's grouping
  /// launch goes (the same groups; one launch a layer less). bench-40L-E64 on one H100 (Engram
  /// tables in host memory): batch 1 8.22-8.30 against 8.30-8.33 ms a step, batch 8 18.65-18.76
  /// against 18.71-18.77. $CEDAR_GPU_EXPERT_PLAN=0 turns it off (A/B runs).
  bool expert_plan_in_route = true;
};
/// The process's thresholds (tests and the lab may change them; set before use).
tuning& tuning_now();
/// On (the default): every decode-path row count keeps one summation order, so a row's bits never
/// depend on how many rows it is batched with. Off: the stream tile at 1-2 rows where it is faster
/// (stream_max_rows, expert_stream_max_rows). $CEDAR_GPU_BATCH_INVARIANT=0 starts the process off.
void set_batch_invariant(bool on);

/// xq / xs, when given, are x's codes and scales from quantize_rows_fp8 (or finish_rows), used
/// where linear_fp8_takes_codes(m, w) (else x is read).
void linear_fp8(const float* x, int m, const fp8_weight& w, float* y, const uint8_t* xq = nullptr,
                const float* xs = nullptr);
/// Whether linear_fp8 at m rows streams w on a tile of x's FP8 codes (not the bf16 prefill path).
bool linear_fp8_takes_codes(int m, const fp8_weight& w);
void linear_fp4(const float* x, int m, const fp4_weight& w, float* y);
/// `count` (1 to 4) FP8 linears of one x (the same in): y[i] = linear_fp8(x, m, *w[i]) bit for
/// bit; up to gemv_max_rows x is quantized once (or xq / xs, x's codes and scales from
/// quantize_rows_fp8, are used when given) and one launch serves them all (the split8 tile at up
/// to 8 rows with K >= split_min_k, else the gemv tile).
void linear_fp8_set(const float* x, int m, int count, const fp8_weight* const* w, float* const* y,
                    const uint8_t* xq = nullptr, const float* xs = nullptr);
/// Whether linear_fp8_set at m rows reads xq / xs (else it takes x through linear_fp8).
bool linear_fp8_set_takes_codes(int m, int count, const fp8_weight* const* w);
/// x fp32 (not rounded to bf16, as the CPU op), w bf16.
void linear_bf16(const float* x, int m, const bf16_weight& w, float* y);
/// wo_a8, when given, is wo_a's FP8 form (the same values): the few-row GEMV reads it instead.
void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a, const fp8_weight& wo_b, float* out,
                    const fp8_weight* wo_a8 = nullptr);
/// experts and shared: HOST arrays of views with device pointers; sel, weights: device.
/// round_out: out rounded to bf16 as cuda::round_bf16 (in the same launch). yq / ys, when given,
/// are y's codes and scales (quantize_rows_fp8), used where the experts read codes (decode).
/// plan: moe_route's grouping of these sel (made: rows == m), used in place of moe_ffn's own.
void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared,
             float limit, float* out, bool round_out = false, const uint8_t* yq = nullptr,
             const float* ys = nullptr, const expert_plan* plan = nullptr);
/// moe_ffn's parts, for layouts that split the experts over ranks (kernels/cuda_model): slots
/// [m * topk, d] gets each slot's routed output, zeros for a slot whose expert this rank does not
/// hold (a null entry of `experts`); shared_out [m, d] the shared expert's, when shared is given.
/// Per slot the same bits as inside moe_ffn at the same m; nothing is combined or rounded.
void moe_slots(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
               const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared,
               float limit, float* slots, float* shared_out, const uint8_t* yq = nullptr,
               const float* ys = nullptr);
/// The shared expert alone (moe_ffn's: the same bits), out [m, d].
void shared_ffn(const float* y, int m, const cpu::shared_expert_weights& shared, float limit, float* out,
                const uint8_t* yq = nullptr, const float* ys = nullptr);
/// moe_ffn's combine over slots [m * topk, d] in top-k order, + shared [m, d] (null: + 0), out
/// rounded to bf16 when round_out: from moe_slots' outputs, moe_ffn's out bit for bit.
void moe_combine(const float* slots, const float* shared, int m, int topk, int d, bool round_out, float* out);
/// DEP's dispatch of m rows' slots [m * topk] (sel, weights) over `ranks` ranks (expert e on
/// rank e mod ranks; a slot with sel < 0 goes nowhere), planned on the device: the outgoing
/// records in rank order, slot order within a rank: src_rows [records] the slot's row, head
/// [records, 2] its expert id and routing weight (floats); from [m * topk] each slot's record
/// (the record count for a slot that goes nowhere); counts [ranks] (uint64) records a rank.
void dep_dispatch_plan(const int32_t* sel, const float* weights, int m, int topk, int ranks, int32_t* src_rows,
                       float* head, int32_t* from, uint64_t* counts);
/// DEP's received slot headers [n, 2] (expert id, routing weight, as floats) -> sel [n] and
/// weights [n] on the device; an id that is not an expert of [0, num_experts) becomes -1 (no
/// expert: moe_slots leaves the slot zero, as it does for an expert this rank does not hold).
void unpack_slot_headers(const float* head, int n, int num_experts, int32_t* sel, float* weights);

namespace detail {
/// W (FP8 or W4A8) -> bf16 [out, in], exact (scales >= 2^-124).
void dequant_bf16(const fp8_weight& w, uint16_t* out);
/// FP4: on_stream, when given, is the stream to run on instead of the current one.
void dequant_bf16(const fp4_weight& w, uint16_t* out, void* on_stream = nullptr);
/// out [m, k] bf16 = fmt::fake_quant_fp8 of x rows (rows[r] when given; zeros at r >= *count),
/// with wg_order each 64-column block in the wgmma experts' order (experts_wg.hpp, wg_column).
void fake_quant_bf16(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k, uint16_t* out,
                     bool wg_order = false);
/// out [parts, m, k] bf16: x = out[0] + out[1] + out[2] exactly with three parts, within
/// 2^-18 |x| with two.
void split_bf16(const float* x, int ldx, int m, int k, int parts, uint16_t* out);
/// y [m, n] (+)= a [m, k] w [n, k]^T, bf16 in, fp32 accumulation and out (cuBLAS); batch > 1:
/// strided batches (element strides).
void gemm_bf16(const uint16_t* a, int lda, int m, const uint16_t* w, int ldw, int n, int k, float* y, int ldy,
               bool accumulate, int batch = 1, long long a_stride = 0, long long w_stride = 0, long long y_stride = 0);
/// y [m, n] = x [m, k] w [n, k]^T, fp32 x, bf16 w, groups side by side (element strides);
/// false (nothing run) when k % 8 != 0 or the rows are not 16-byte aligned.
bool gemv_bf16(const float* x, int ldx, int m, const uint16_t* w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long w_group, long long y_group);
/// The same with an FP8 weight of `groups` x n rows (n % 32 == 0, k % 32 == 0), its products
/// the bf16 form's (scale codes >= 3): gemv_bf16's bits from half the bytes.
bool gemv_fp8w(const float* x, int ldx, int m, const fp8_weight& w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long y_group);
/// gemv_fp8w at one row that also writes y's FP8 codes and scales, as quantize_rows_fp8 would
/// (codes [groups y_group], a scale a 32), where its one-row form allows it (4 columns a warp,
/// so a block's outputs are one group of 32; y_group % 32 == 0); false (nothing run) elsewhere.
bool gemv_fp8w_codes(const float* x, int ldx, const fp8_weight& w, int n, int k, float* y, int groups,
                     long long x_group, long long y_group, uint8_t* codes, float* scales);
}  // namespace detail

// ---- a branch of work on a second stream ----------------------------------------------------

/// side_begin: the work enqueued so far on the current stream must finish before what follows,
/// which goes to the calling thread's second stream (it becomes current); side_end: back to the
/// first stream (the side work is not waited for); side_wait: the current stream waits for the
/// side work up to side_end. Inside a graph capture the side work is a branch of the graph (end
/// it and wait before the capture ends). Not nested. side_pending: a branch has ended that no
/// side_wait has waited for since.
void side_begin();
void side_end();
void side_wait();
bool side_pending();

// ---- lab helpers ----------------------------------------------------------------------------

/// Mean milliseconds of one call of fn(i) over `iters` calls (after `warmup`), launched one by
/// one from the host, CUDA events on the current stream.
double time_ms(const std::function<void(int)>& fn, int warmup, int iters);
/// The same with the `iters` calls captured into one CUDA graph (launched once to warm up, then
/// timed): the device time without the host's per-launch cost. The current stream must not be
/// the legacy default stream.
double graph_time_ms(const std::function<void(int)>& fn, int iters);
/// A new non-blocking stream (cudaStream_t), and its release.
void* create_stream();
void destroy_stream(void* s);
/// Device-to-device copy bandwidth in GB/s (read + write bytes / time) over `bytes`.
double copy_bandwidth_gbps(std::size_t bytes);

/// A cuBLASLt matrix product y [m, n] = x [m, k] W^T with per-tensor scale 1: FP8 e4m3 inputs
/// and bf16 output when the library offers it, else bf16 inputs. Owns its device buffers: W in
/// `copies` copies, run(i) reading copy i % copies (so that W can be made to come from HBM).
class blaslt_gemm {
 public:
  blaslt_gemm(int m, int n, int k, int copies = 1);
  ~blaslt_gemm();
  blaslt_gemm(const blaslt_gemm&) = delete;
  blaslt_gemm& operator=(const blaslt_gemm&) = delete;
  bool ok() const { return ok_; }
  const std::string& dtype() const { return dtype_; }  ///< "fp8" or "bf16"
  void run(int i = 0);

 private:
  bool setup(bool fp8);
  int m_, n_, k_, copies_;
  bool ok_ = false;
  std::string dtype_;
  void* impl_ = nullptr;
};

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda::fast
