// The fast kernel set's linear layers (fast_ops.hpp): the contracts of cuda::linear_fp8/fp4/bf16
// and grouped_output on tensor cores, and the bf16 building blocks the experts' prefill path
// uses too (experts_fast.cu).
//
// Decode (few rows): the gemv tile of gemm.cu (FP8/W4A8, activations quantized to e4m3 codes)
// and a bandwidth-bound bf16 GEMV (gemv.cu).
// Prefill (many rows): weights dequantized into a bf16 scratch and a cuBLAS bf16 GEMM with fp32
// accumulation and output. That computes the CPU op's products exactly: an e4m3 code (4
// significant bits, ulp >= 2^-9) or an E2M1 value (2 bits) times a UE8M0 scale >= 2^-124 is a
// bf16 value (bf16 has fp32's exponent range; subnormals down to 2^-133), and so is a fake-quantized
// activation (scale >= 2^-22, fmt::quantize_fp8's floor); the product of two bf16 values is exact
// in fp32. Only the order of the fp32 sums differs. bf16 weights take fp32 activations on the
// CPU (not rounded to bf16): x is split exactly into three bf16 parts (8 + 8 + 8 significant
// bits cover fp32's 24) and the three products are summed into y; wo_a, whose output feeds
// no top-k choice, takes two parts (within 2^-18 of sum|x w|, a quarter of the 2^-16 bound).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::aligned16;
using cuda::detail::blocks_for;
using cuda::detail::scratch;
using cuda::detail::stream;

/// fp32 -> bf16 bits, round to nearest even (exact for values that are bf16 already).
__device__ __forceinline__ uint16_t to_bf16(float x) { return cuda::detail::f32_to_bf16(x); }

// ---- dequantization into bf16 ------------------------------------------------------------------

/// An FP8 weight [n, k] (k % 8 == 0, n k < 2^31) -> bf16 [n, k], by pieces of 8 codes: thread t
/// takes pieces t + i * stride (i < 4, stride = the grid's threads), every load issued before
/// the first conversion (e4m3 -> f16 -> fp32 in hardware: exact), 16 bytes stored a piece.
__global__ void dequant_fp8_kernel(const uint8_t* data, const uint8_t* scale, int n, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  constexpr int per_thread = 4;
  const int pieces = n * (k / 8), per_row = k / 8, scale_cols = (k + 31) / 32;
  const int stride = int(gridDim.x * blockDim.x), q0 = int(blockIdx.x * blockDim.x + threadIdx.x);
  uint2 v[per_thread];
  uint8_t sc[per_thread];
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const int q = q0 + i * stride;
    const int row = q / per_row, col = (q % per_row) * 8;
    v[i] = q < pieces ? __ldg(reinterpret_cast<const uint2*>(data) + q) : make_uint2(0, 0);
    sc[i] = q < pieces ? __ldg(scale + size_t(row / 32) * scale_cols + col / 32) : uint8_t(0);
  }
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const int q = q0 + i * stride;
    if (q >= pieces) break;
    const float s = cuda::detail::ue8m0_to_f32(sc[i]);
    uint32_t o[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const uint32_t word = h < 2 ? v[i].x : v[i].y;
      const float2 f = cuda::detail::e4m3x2_to_f32(word >> (16 * (h % 2)));
      o[h] = uint32_t(to_bf16(f.x * s)) | (uint32_t(to_bf16(f.y * s)) << 16);
    }
    reinterpret_cast<uint4*>(out)[q] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/// A packed E2M1 weight [n, k] -> bf16 [n, k], by 4-byte words (8 values; four words share a
/// UE8M0 scale: scales are [n, k / 32], the words' order): thread t takes words t + i * stride
/// (i < 4, stride = the grid's threads), all four loads issued before the first conversion, and
/// stores 16 bytes a word, so a warp's loads and stores are each one contiguous span.
__global__ void dequant_fp4_kernel(const uint8_t* data, const uint8_t* scale, long long words, uint16_t* out) {
  cuda::detail::dependent_start();
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = cuda::detail::e2m1_to_f32(uint8_t(threadIdx.x));
  __syncthreads();
  constexpr int per_thread = 4;
  const long long stride = (long long)gridDim.x * blockDim.x, w0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  uint32_t v[per_thread];
  uint8_t sc[per_thread];
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const long long w = w0 + i * stride;
    v[i] = w < words ? __ldg(reinterpret_cast<const uint32_t*>(data) + w) : 0u;
    sc[i] = w < words ? __ldg(scale + (w >> 2)) : uint8_t(0);
  }
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const long long w = w0 + i * stride;
    if (w >= words) break;
    const float s = cuda::detail::ue8m0_to_f32(sc[i]);
    uint32_t o[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (v[i] >> (8 * b)) & 0xFF;  // low nibble = even column
      o[b] = uint32_t(to_bf16(lut[byte & 0xF] * s)) | (uint32_t(to_bf16(lut[byte >> 4] * s)) << 16);
    }
    reinterpret_cast<uint4*>(out)[w] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/// Four threads per group of 32 (8 values each): row r of out [m, k] is fmt::fake_quant_fp8 of
/// x row rows[r] (or r) as bf16 (exact), its columns in wg_column's order with wg_order. Rows at
/// or past *count (when given) or with rows[r] < 0 are zeros. v / s is computed as v * (1 / s): s
/// is a power of two, so both are the same correctly rounded value.
__global__ void fake_quant_bf16_kernel(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k,
                                       bool wg_order, uint16_t* out) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // 8 values each
  const int per_row = k / 8;
  const bool in = t < (long long)m * per_row;
  const int r = in ? int(t / per_row) : 0, c8 = in ? int(t % per_row) : 0;
  int src = in ? r : -1;
  if (in && count && r >= *count) src = -1;
  else if (in && rows) src = rows[r];
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (src >= 0) {
    const float4* p = reinterpret_cast<const float4*>(x + size_t(src) * ldx + c8 * 8);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  const uint4 q = cuda::detail::fake_quant8_bf16(v);
  if (in) store8(out + size_t(r) * k, c8, q, wg_order);
}

/// x [m, k] (row stride ldx) -> out [Parts, m, k] bf16: each part the residual of the ones
/// before, rounded (exact in fp32). Three parts give x exactly; two leave |x - hi - lo| <=
/// 2^-18 |x|. Grid (m, ceil(k / 4 / blockDim.x)): four values a thread, with Vec (k % 4 == 0,
/// ldx % 4 == 0, x 16-byte aligned) one 16-byte load and one 8-byte store a part.
template <int Parts, bool Vec>
__global__ void split_kernel(const float* x, int ldx, int m, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  const int r = int(blockIdx.x), c0 = 4 * int(blockIdx.y * blockDim.x + threadIdx.x);
  if (c0 >= k) return;
  const float* xr = x + size_t(r) * ldx;
  float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (Vec) {
    const float4 v = *reinterpret_cast<const float4*>(xr + c0);
    rest[0] = v.x, rest[1] = v.y, rest[2] = v.z, rest[3] = v.w;
  } else {
    for (int i = 0; i < 4 && c0 + i < k; ++i) rest[i] = xr[c0 + i];
  }
  const size_t n = size_t(m) * k;
#pragma unroll
  for (int p = 0; p < Parts; ++p) {
    uint16_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[i] = to_bf16(rest[i]);
      rest[i] -= cuda::detail::bf16_to_f32(h[i]);
    }
    uint16_t* o = out + p * n + size_t(r) * k + c0;
    if constexpr (Vec) {
      *reinterpret_cast<uint2*>(o) =
          make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
    } else {
      for (int i = 0; i < 4 && c0 + i < k; ++i) o[i] = h[i];
    }
  }
}

// ---- cuBLAS --------------------------------------------------------------------------------

cublasHandle_t blas() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::abort();
    }
    cublasSetMathMode(x, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    return x;
  }();  // one per thread for the process's life
  cublasSetStream(h, stream());
  return h;
}

void blas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: cuBLAS status %d\n", what, int(st));
    std::abort();
  }
}

}  // namespace

// ---- building blocks -----------------------------------------------------------------------------

void dequant_bf16(const fp8_weight& w, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(w.in % 8 == 0 && (long long)w.out * w.in < (1ll << 31), "dequant_bf16: in % 8 == 0, < 2^31 codes");
  const long long pieces = (long long)w.out * w.in / 8;
  if (pieces == 0) return;
  cuda::detail::launch_dependent(dequant_fp8_kernel, dim3(blocks_for((pieces + 3) / 4, 256)), dim3(256), 0, w.data,
                                 w.scale, w.out, w.in, out);
}

void dequant_bf16(const fp4_weight& w, uint16_t* out, void* on_stream) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "dequant_bf16: in % 32 == 0");
  const long long words = (long long)w.out * w.in / 8;
  if (words == 0) return;
  const unsigned blocks = blocks_for((words + 3) / 4, 256);  // four words a thread
  if (on_stream == nullptr) {
    cuda::detail::launch_dependent(dequant_fp4_kernel, dim3(blocks), dim3(256), 0, w.data, w.scale, words, out);
    return;
  }
  dequant_fp4_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(on_stream)>>>(w.data, w.scale, words, out);
  CEDAR_CUDA_CHECK(cudaGetLastError());
}

void fake_quant_bf16(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k, uint16_t* out,
                     bool wg_order) {
  CEDAR_CUDA_REQUIRE(k % 32 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                     "fake_quant_bf16: k % 32 == 0, 16-byte aligned rows");
  const long long threads = (long long)m * k / 8;
  if (threads == 0) return;
  cuda::detail::launch_dependent(fake_quant_bf16_kernel, dim3(blocks_for(threads, 256)), dim3(256), 0, x, ldx, rows,
                                 count, m, k, wg_order, out);
}

void split_bf16(const float* x, int ldx, int m, int k, int parts, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(parts == 2 || parts == 3, "split_bf16: two or three parts");
  if (m <= 0 || k <= 0) return;
  const bool vec = k % 4 == 0 && ldx % 4 == 0 && aligned16(x) && aligned16(out);
  const auto kernel = parts == 2 ? (vec ? split_kernel<2, true> : split_kernel<2, false>)
                                 : (vec ? split_kernel<3, true> : split_kernel<3, false>);
  const dim3 grid(unsigned(m), blocks_for((k + 3) / 4, 256));
  cuda::detail::launch_dependent(kernel, grid, dim3(256), 0, x, ldx, m, k, out);
}

void gemm_bf16(const uint16_t* a, int lda, int m, const uint16_t* w, int ldw, int n, int k, float* y, int ldy,
               bool accumulate, int batch, long long a_stride, long long w_stride, long long y_stride) {
  if (m <= 0 || n <= 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // row-major y [m, n] = a [m, k] w[n, k]^T is column-major y^T [n, m] = w^T (k x n)^T a^T (k x m)
  if (batch == 1)
    blas_check(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, ldw, a, CUDA_R_16BF,
                            lda, &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  else
    blas_check(cublasGemmStridedBatchedEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, ldw,
                                          w_stride, a, CUDA_R_16BF, lda, a_stride, &beta, y, CUDA_R_32F, ldy, y_stride,
                                          batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

}  // namespace detail

using namespace detail;

namespace {

void batch_invariance(tuning& t, bool on) {
  t.stream_max_rows = on ? stream_max_slots : 2;
  t.attention_split_rows = on ? stream_max_slots : 0;
  t.expert_stream_max_rows = on ? 0 : 2;
}

}  // namespace

tuning& tuning_now() {
  static tuning t = [] {
    tuning d;
    // NAME=0: a path off (A/B runs)
    const auto is_off = [](const char* name) {
      const char* env = std::getenv(name);
      return env && std::string(env) == "0";
    };
    // CEDAR_GPU_STREAM_TILE=0: no dense weight on the stream tile (A/B runs of the model)
    if (is_off("CEDAR_GPU_STREAM_TILE")) d.stream_min_out = std::numeric_limits<int>::max();
    // CEDAR_GPU_BATCH_INVARIANT=0: the fastest tile at each row count, though a row's bits then
    // depend on how many rows it is batched with
    if (is_off("CEDAR_GPU_BATCH_INVARIANT")) batch_invariance(d, false);
    // CEDAR_GPU_GEMV_EARLY=0 / CEDAR_GPU_BOUNDARY_EARLY=0: the one-row GEMV / the one-launch mHC
    // boundary load no weight before their dependency wait
    if (is_off("CEDAR_GPU_GEMV_EARLY")) d.gemv_weight_early = false;
    if (is_off("CEDAR_GPU_BOUNDARY_EARLY")) d.boundary_weight_early = false;
    // CEDAR_GPU_BOUNDARY_FINISH=0: the one-launch boundary's last block finishes the row itself
    if (is_off("CEDAR_GPU_BOUNDARY_FINISH")) d.boundary_finish_apart = false;
    // CEDAR_GPU_BOUNDARY_BRANCH=0: under graphs the boundary's Sinkhorn stays in the step's chain
    if (is_off("CEDAR_GPU_BOUNDARY_BRANCH")) d.boundary_sinkhorn_branch = false;
    // CEDAR_GPU_ATTENTION_ROTATES_Q=0: the decode queries rotated by the kv row chain's launch
    // after wq_b, not as the attention loads them
    if (is_off("CEDAR_GPU_ATTENTION_ROTATES_Q")) d.attention_rotates_q = false;
    // CEDAR_GPU_SWIGLU_IN_TILE=0: the routed experts' SwiGLU in a launch of its own
    if (is_off("CEDAR_GPU_SWIGLU_IN_TILE")) d.expert_swiglu_in_tile = false;
    // CEDAR_GPU_EXPERT_PLAN=0: moe_ffn groups the routed slots in a launch of its own
    if (is_off("CEDAR_GPU_EXPERT_PLAN")) d.expert_plan_in_route = false;
    // CEDAR_GPU_GEMV_CODES=0: wo_a's one-row GEMV leaves wo_b's codes to their own launch
    if (is_off("CEDAR_GPU_GEMV_CODES")) d.gemv_codes = false;
    // CEDAR_GPU_GEMV_COLS=C[xU]: the one-row GEMV's columns a warp (1: one, gemv_bf16_kernel;
    // 2 or 4: gemv_cols_kernel) and pieces of each column in flight (2 or 4)
    if (const char* env = std::getenv("CEDAR_GPU_GEMV_COLS"); env && *env) {
      int c = 0, u = d.gemv_one_row_unroll;
      const int got = std::sscanf(env, "%dx%d", &c, &u);
      if (got >= 1 && (c == 1 || ((c == 2 || c == 4) && (u == 2 || u == 4)))) d.gemv_one_row_cols = c, d.gemv_one_row_unroll = u;
      else std::fprintf(stderr, "cedar: CEDAR_GPU_GEMV_COLS='%s' is not 1, or 2 or 4 with x2 or x4; ignored\n", env);
    }
    // NAME=N, where set: a path from N rows on (0: never)
    const auto rows_from = [](const char* name, int& min_rows) {
      if (const char* env = std::getenv(name); env && *env) {
        const int v = std::atoi(env);
        min_rows = v <= 0 ? std::numeric_limits<int>::max() : v;
      }
    };
    rows_from("CEDAR_GPU_GEMV_STAGED_FROM", d.gemv_staged_min_rows);    // the bf16 GEMV's staged mode
    rows_from("CEDAR_GPU_EXPERT_PAIRS_FROM", d.expert_pairs_min_rows);  // routed experts on x's pairs
    rows_from("CEDAR_GPU_EXPERT_WG_FROM", d.expert_wg_min_rows);        // routed experts on wgmma
    // CEDAR_GPU_EXPERT_WG_TILE=16|32|64|128|256: the wgmma experts' token tile (A/B runs)
    if (const char* env = std::getenv("CEDAR_GPU_EXPERT_WG_TILE"); env && *env) {
      const int v = std::atoi(env);
      if (is_wg_tile(v)) d.expert_wg_tile = v;
      else std::fprintf(stderr, "cedar: CEDAR_GPU_EXPERT_WG_TILE='%s' is not 16, 32, 64, 128 or 256; ignored\n", env);
    }
    return d;
  }();
  return t;
}

void set_batch_invariant(bool on) { batch_invariance(tuning_now(), on); }

// ---- linear layers -----------------------------------------------------------------------------

namespace {

/// A weight the split tiles stream at up to 8 rows: their shape, and K long enough to split.
bool split_fits(int n, int k, const tuning& tune) { return n % 16 == 0 && k % 128 == 0 && k >= tune.split_min_k; }

template <class W>
void prefill_linear(const float* x, int m, const W& w, float* y) {
  const uint16_t* kept = nullptr;  // a bf16 copy the model keeps (fp8_weight::bf16)
  if constexpr (std::is_same_v<W, fp8_weight>) kept = w.bf16;
  scratch<uint16_t> wb(kept ? 0 : size_t(w.out) * w.in), xb(size_t(m) * w.in);
  if (!kept) dequant_bf16(w, wb.get());
  fake_quant_bf16(x, w.in, nullptr, nullptr, m, w.in, xb.get());
  gemm_bf16(xb.get(), w.in, m, kept ? kept : wb.get(), w.in, w.out, w.in, y, w.out, false);
}

/// The tile quantized_linear streams w with at m rows, or nothing: the bf16 prefill path.
template <bool FP4, class W>
std::optional<tile_kind> quantized_tile(int m, const W& w) {
  const tuning& tune = tuning_now();
  const bool gemv = m <= tune.gemv_max_rows && gemv_shape(w.out, w.in);
  bool kept = false;  // a bf16 copy the model keeps: its GEMM beats the tile
  if constexpr (!FP4) kept = w.bf16 != nullptr;
  const bool narrow_fits = w.out % 64 == 0 && w.in % 256 == 0;  // the narrow and narrow32 tiles
  const bool tiled = !gemv && !kept && narrow_fits && m <= tune.fp8_narrow_max_rows &&
                     (long long)w.out * w.in >= tune.fp8_narrow_min_weight;
  const bool split = m <= 8 && split_fits(w.out, w.in, tune) && w.out >= tune.split_min_out;
  const bool narrow = !split && narrow_fits && m <= 8 && w.out >= tune.dense_stream_min_out;
  bool stream = false;  // the stream tile: FP8, short K, many rows (FP4 dense weights stay on the tiles)
  if constexpr (!FP4)
    stream = m <= std::min(tune.stream_max_rows, stream_max_slots) && w.in <= tune.stream_max_k &&
             w.out >= tune.stream_min_out && stream_shape(false, w.out, w.in);
  if (stream) return tile_kind::stream;
  if (!(gemv || tiled || narrow || split)) return std::nullopt;
  return split ? tile_kind::split4 : narrow ? tile_kind::narrow : gemv ? tile_kind::gemv : tile_kind::narrow32;
}

template <bool FP4, class W>
void quantized_linear(const float* x, int m, const W& w, float* y, const uint8_t* xq = nullptr,
                      const float* xs = nullptr) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "fast linear: in is a multiple of 32");
  if (m <= 0) return;
  const std::optional<tile_kind> t = quantized_tile<FP4>(m, w);
  if (!t) return prefill_linear(x, m, w, y);
  scratch<uint8_t> q(xq ? 0 : size_t(m) * w.in);
  scratch<float> s(xq ? 0 : size_t(m) * (w.in / 32));
  if (!xq) {
    quantize_rows_fp8(x, m, w.in, q.get(), s.get());
    xq = q.get(), xs = s.get();
  }
  if constexpr (FP4) gemm_fp4(xq, xs, m, w, y, *t);
  else gemm_fp8(xq, xs, m, w, y, *t);
}

/// y [m, n] (row stride ldy) = x [m, k] (row stride ldx) W^T for bf16 W, by the split of x into
/// `parts` bf16 parts, one GEMM pass each (3: the CPU op's products; 2: within 2^-18 of
/// sum|x w|); groups > 1: a batch of groups with the given element strides.
void split_gemm(const float* x, int ldx, int m, const uint16_t* w, int n, int k, float* y, int ldy, int parts,
                int groups, long long x_group, long long w_group, long long y_group) {
  const int kx = groups * k;  // the split covers the groups side by side when they are (x_group == k)
  const bool side_by_side = groups == 1 || x_group == k;
  CEDAR_CUDA_REQUIRE(side_by_side, "split_gemm: groups side by side in x");
  scratch<uint16_t> xb(size_t(parts) * m * kx);
  split_bf16(x, ldx, m, kx, parts, xb.get());
  for (int p = 0; p < parts; ++p)
    gemm_bf16(xb.get() + size_t(p) * m * kx, kx, m, w, k, n, k, y, ldy, p > 0, groups, k, w_group, y_group);
}

}  // namespace

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y, const uint8_t* xq, const float* xs) {
  quantized_linear<false>(x, m, w, y, xq, xs);
}

bool linear_fp8_takes_codes(int m, const fp8_weight& w) {
  return w.in % 32 == 0 && quantized_tile<false>(m, w).has_value();
}

void linear_fp4(const float* x, int m, const fp4_weight& w, float* y) { quantized_linear<true>(x, m, w, y); }

bool linear_fp8_set_takes_codes(int m, int count, const fp8_weight* const* w) {
  bool gemv = m <= tuning_now().gemv_max_rows;
  for (int i = 0; i < count; ++i) gemv = gemv && gemv_shape(w[i]->out, w[i]->in);
  return gemv;
}

void linear_fp8_set(const float* x, int m, int count, const fp8_weight* const* w, float* const* y,
                    const uint8_t* xq, const float* xs) {
  CEDAR_CUDA_REQUIRE(count >= 1 && count <= 4, "linear_fp8_set: 1 to 4 weights");
  if (m <= 0) return;
  for (int i = 0; i < count; ++i)
    CEDAR_CUDA_REQUIRE(w[i]->in == w[0]->in && w[i]->in % 32 == 0, "linear_fp8_set: one x, in a multiple of 32");
  if (!linear_fp8_set_takes_codes(m, count, w)) {
    for (int i = 0; i < count; ++i) linear_fp8(x, m, *w[i], y[i]);
    return;
  }
  const tuning& tune = tuning_now();
  bool split = m <= 8;
  int blocks = 0;  // 16 output rows each
  for (int i = 0; i < count; ++i) {
    split = split && split_fits(w[i]->out, w[i]->in, tune);
    blocks += w[i]->out / 16;
  }
  // split8 (86 KB of shared memory a block) holds 2 blocks an SM: a set of more blocks than that
  // (the shared expert's w1 + w3, 288 on 132 SMs) would run a second wave, so it takes split4
  const tile_kind t = !split                                               ? tile_kind::gemv
                      : blocks <= set_blocks_at_once(tile_kind::split8) ? tile_kind::split8
                                                                         : tile_kind::split4;
  if (xq != nullptr) return gemm_fp8_set(xq, xs, m, count, w, y, t);
  const int k = w[0]->in;
  scratch<uint8_t> q(size_t(m) * k);
  scratch<float> s(size_t(m) * (k / 32));
  quantize_rows_fp8(x, m, k, q.get(), s.get());
  gemm_fp8_set(q.get(), s.get(), m, count, w, y, t);
}

void linear_bf16(const float* x, int m, const bf16_weight& w, float* y) {
  if (m <= 0) return;
  if (m <= tuning_now().bf16_gemv_max_rows && gemv_bf16(x, w.in, m, w.data, w.out, w.in, y, w.out, 1, 0, 0, 0)) return;
  // exact x: the router gate, the indexer's weights and the compressor feed top-k choices,
  // which a last-bit difference in a logit can flip
  split_gemm(x, w.in, m, w.data, w.out, w.in, y, w.out, 3, 1, 0, 0, 0);
}

void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a, const fp8_weight& wo_b, float* out,
                    const fp8_weight* wo_a8) {
  CEDAR_CUDA_REQUIRE(groups > 0 && wo_a.out % groups == 0, "wo_a rows split into groups");
  CEDAR_CUDA_REQUIRE(wo_b.in == wo_a.out, "wo_b takes concat(u)");
  if (m <= 0) return;
  const int rank = wo_a.out / groups, group_in = wo_a.in;
  scratch<float> u(size_t(m) * wo_a.out);
  const long long w_group = (long long)rank * group_in;
  // u[r, g rank + j] = o[r, g group_in ...] . wo_a[g rank + j]: at few rows the GEMV, from the
  // FP8 form when the model keeps it (half the bytes, the same bits)
  const int ldo = groups * group_in;
  // one row, wo_a's FP8 form: its GEMV also writes the codes wo_b's tile reads
  if (m == 1 && wo_a8 != nullptr && wo_a8->data != nullptr && linear_fp8_takes_codes(1, wo_b)) {
    scratch<uint8_t> uq(wo_a.out);
    scratch<float> us(wo_a.out / 32);
    if (gemv_fp8w_codes(o, ldo, *wo_a8, rank, group_in, u.get(), groups, group_in, rank, uq.get(), us.get()))
      return linear_fp8(u.get(), 1, wo_b, out, uq.get(), us.get());
  }
  const bool few = m <= tuning_now().bf16_gemv_max_rows;
  const bool by_gemv =
      few && ((wo_a8 != nullptr && wo_a8->data != nullptr &&
               gemv_fp8w(o, ldo, m, *wo_a8, rank, group_in, u.get(), wo_a.out, groups, group_in, rank)) ||
              gemv_bf16(o, ldo, m, wo_a.data, rank, group_in, u.get(), wo_a.out, groups, group_in, w_group, rank));
  // else two parts: wo_a feeds no choice, and at prefill the third GEMM pass over [m, 8 x 4096]
  // is a third of its time
  if (!by_gemv) split_gemm(o, ldo, m, wo_a.data, rank, group_in, u.get(), wo_a.out, 2, groups, group_in, w_group, rank);
  linear_fp8(u.get(), m, wo_b, out);
}

}  // namespace cedar::cuda::fast
