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

#include "kernels/weights.hpp"

namespace cedar::cuda::fast {

#ifdef CEDAR_HAVE_CUDA

/// Tile shapes of the tensor-core GEMM (rows of W x tokens per block):
/// gemv (weight read straight into fragments, 128-wide K chunks summed by a second pass;
/// m <= 8, or 16 at a cost), skinny 32x64 (m <= 64) and wide 128x128 (prefill), both pipelined.
enum class tile_kind { gemv, skinny, wide };
const char* tile_name(tile_kind t);
/// The tile the library picks for m rows.
tile_kind pick_tile(int m);

/// codes [m, k] e4m3 and scales [m, k/32] (powers of two) of x [m, k]; k % 32 == 0.
void quantize_rows_fp8(const float* x, int m, int k, uint8_t* codes, float* scales);

/// y [m, w.out] = W x for FP8-quantized x (codes, scales as quantize_rows_fp8 writes them).
/// Needs w.out % 128 == 0 and w.in % 256 == 0. Every tile gives the same bits.
void gemm_fp8(const uint8_t* xq, const float* xs, int m, const fp8_weight& w, float* y, tile_kind t);
/// As gemm_fp8 with a W4A8 weight (E2M1 turned into e4m3 in registers).
void gemm_fp4(const uint8_t* xq, const float* xs, int m, const fp4_weight& w, float* y, tile_kind t);

/// One expert's share of a grouped W4A8 product.
struct expert_group {
  const uint8_t* w = nullptr;      // [n, k/2] packed e2m1 (device)
  const uint8_t* scale = nullptr;  // [n, k/32] ue8m0 (device)
  int first_slot = 0;              ///< its slots are slot_rows[first_slot, first_slot + num_slots)
  int num_slots = 0;
};

/// Grouped W4A8: for every group g and each of its slots s, y[s] = W_g x[slot_rows[s]].
/// groups is a DEVICE array of num_groups whose slot ranges lie in [0, total_slots);
/// slot_rows a device array; max_slots bounds every num_slots. All experts share n and k.
void grouped_fp4(const uint8_t* xq, const float* xs, const int32_t* slot_rows /*[total_slots]*/,
                 const expert_group* groups, int num_groups, int total_slots, int max_slots, int n,
                 int k, float* y /*[total_slots, n]*/, tile_kind t);

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
