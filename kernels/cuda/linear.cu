// CUDA linear layers (ops.hpp semantics): one warp per output column and a tile of 4 rows,
// each dot in the CPU's dot_order, weights decoded on the fly (exact, as in kernels/cpu/dot.cpp),
// so every output has the CPU's bits and does not depend on the row count.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

constexpr int warps_per_block = 8;
constexpr int rows_per_warp = 4;

struct fp8_decoder {
  const uint8_t* data;   // [out, in] e4m3
  const uint8_t* scale;  // [ceil(out/32), ceil(in/32)] ue8m0
  int in, scale_cols;
  __device__ float operator()(int n, int k) const {
    return e4m3_to_f32(data[size_t(n) * in + k]) * ue8m0_to_f32(scale[size_t(n / 32) * scale_cols + k / 32]);
  }
};

struct fp4_decoder {
  const uint8_t* data;   // [out, in/2] packed e2m1
  const uint8_t* scale;  // [out, in/32] ue8m0
  int in;
  __device__ float operator()(int n, int k) const {
    const uint8_t byte = data[(size_t(n) * in + k) / 2];
    const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
    return e2m1_to_f32(code) * ue8m0_to_f32(scale[size_t(n) * (in / 32) + k / 32]);
  }
};

struct bf16_decoder {
  const uint16_t* data;  // [out, in]
  int in;
  __device__ float operator()(int n, int k) const { return bf16_to_f32(data[size_t(n) * in + k]); }
};

struct f32_decoder {
  const float* data;  // [out, in]
  int in;
  __device__ float operator()(int n, int k) const { return data[size_t(n) * in + k]; }
};

/// grid (ceil(out / 8), ceil(m / 4)), 256 threads: warp w computes column n = 8 * bx + w
/// for rows 4 * by .. +3.
template <class Dec>
__global__ void gemm_kernel(const float* x, int ldx, int m, int out, int in, Dec dec, float* y,
                            int ldy) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * warps_per_block + warp;
  const int r0 = blockIdx.y * rows_per_warp;
  if (n >= out) return;
  const int rows = min(rows_per_warp, m - r0);
  const int n32 = in - in % 32;
  float acc[rows_per_warp] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float* xr = x + size_t(r0) * ldx;
  for (int k = lane; k < n32; k += 32) {
    const float w = dec(n, k);
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i)
      if (i < rows) acc[i] = acc[i] + w * xr[size_t(i) * ldx + k];
  }
#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    if (i >= rows) break;
    float s = warp_fold(acc[i]);
    if (lane == 0) {
      for (int k = n32; k < in; ++k) s = s + xr[size_t(i) * ldx + k] * dec(n, k);
      y[size_t(r0 + i) * ldy + n] = s;
    }
  }
}

template <class Dec>
void launch_gemm(const float* x, int ldx, int m, int out, int in, Dec dec, float* y, int ldy) {
  if (m <= 0 || out <= 0) return;
  const dim3 grid(blocks_for(out, warps_per_block), blocks_for(m, rows_per_warp));
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "gemm: at most 262140 rows per call");
  gemm_kernel<<<grid, warps_per_block * 32, 0, stream()>>>(x, ldx, m, out, in, dec, y, ldy);
  CEDAR_CUDA_LAUNCHED();
}

/// One thread per group of 32: FP8 fake-quant as fmt::fake_quant_fp8.
__global__ void quant_fp8_kernel(const float* x, int ldx, int m, int in, float* xq) {
  const long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const int groups = in / 32;
  if (g >= (long long)m * groups) return;
  const int r = int(g / groups), j = int(g % groups);
  const float* src = x + size_t(r) * ldx + j * 32;
  float* dst = xq + size_t(r) * in + j * 32;
  const float s = fp8_group_scale(group_amax(src, 32));
  for (int i = 0; i < 32; ++i) dst[i] = round_to_e4m3(clampf(src[i] / s, -448.0f, 448.0f)) * s;
}

__global__ void add_kernel(float* out, const float* a, long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = out[i] + a[i];
}

}  // namespace

void gemm_fp8(const float* x, int ldx, int m, const fp8_weight& w, float* y, int ldy) {
  launch_gemm(x, ldx, m, w.out, w.in, fp8_decoder{w.data, w.scale, w.in, (w.in + 31) / 32}, y, ldy);
}
void gemm_fp4(const float* x, int ldx, int m, const fp4_weight& w, float* y, int ldy) {
  launch_gemm(x, ldx, m, w.out, w.in, fp4_decoder{w.data, w.scale, w.in}, y, ldy);
}
void gemm_bf16(const float* x, int ldx, int m, const bf16_weight& w, float* y, int ldy) {
  launch_gemm(x, ldx, m, w.out, w.in, bf16_decoder{w.data, w.in}, y, ldy);
}
void gemm_f32(const float* x, int ldx, int m, const float* w, int out, int in, float* y, int ldy) {
  launch_gemm(x, ldx, m, out, in, f32_decoder{w, in}, y, ldy);
}

void quant_rows_fp8(const float* x, int ldx, int m, int in, float* xq) {
  const long long groups = (long long)m * (in / 32);
  if (groups == 0) return;
  quant_fp8_kernel<<<blocks_for(groups, 256), 256, 0, stream()>>>(x, ldx, m, in, xq);
  CEDAR_CUDA_LAUNCHED();
}

void add_into(float* out, const float* a, long long n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(out, a, n);
  CEDAR_CUDA_LAUNCHED();
}

}  // namespace detail

using namespace detail;

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "linear_fp8: in is a multiple of 32");
  scratch<float> xq(size_t(m) * w.in);
  quant_rows_fp8(x, w.in, m, w.in, xq.get());
  gemm_fp8(xq.get(), w.in, m, w, y, w.out);
}

void linear_fp4(const float* x, int m, const fp4_weight& w, float* y) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "linear_fp4: in is a multiple of 32");
  scratch<float> xq(size_t(m) * w.in);
  quant_rows_fp8(x, w.in, m, w.in, xq.get());
  gemm_fp4(xq.get(), w.in, m, w, y, w.out);
}

void linear_bf16(const float* x, int m, const bf16_weight& w, float* y) {
  gemm_bf16(x, w.in, m, w, y, w.out);
}

void linear_f32(const float* x, int m, const float* w, int out, int in, float* y) {
  gemm_f32(x, in, m, w, out, in, y, out);
}

}  // namespace cedar::cuda
