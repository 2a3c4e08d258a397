// CUDA versions of the formats.hpp fake-quant rules and KV record layouts, one thread per
// group, bit for bit as kernels/formats.cpp.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace cedar::cuda {
namespace detail {
namespace {

enum class rule { fp8, fp4_pow2, fp4_e4m3 };

/// One thread per value (a group's G values in G lanes of one warp; d % 32 == 0, so a warp
/// never spans two rows): the group's max by shuffles (exact in any order), then each lane's
/// value fake-quantized in place (rec == nullptr) or packed into the record, as the serial rule.
template <rule R>
__global__ void group_kernel(float* x, int m, int d, uint8_t* rec, size_t rec_bytes, bool pack) {
  cuda::detail::dependent_start();
  constexpr int G = R == rule::fp4_e4m3 ? 16 : 32;
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t - threadIdx.x % 32 >= (long long)m * d) return;  // whole warps leave together
  const int r = int(t / d), i = int(t % d), g = i / G, lane_in_group = i % G;
  uint8_t* rr = rec ? rec + size_t(r) * rec_bytes : nullptr;
  const float v = x[t];
  const float amax = group_amax_lanes<G>(v);
  if (R == rule::fp8) {
    const float s = fp8_group_scale(amax);
    const float q = clampf(v / s, -448.0f, 448.0f);
    if (pack) {
      rr[i] = f32_to_e4m3(q);
      if (lane_in_group == 0) rr[d + g] = pow2_code(s);
    } else {
      x[t] = round_to_e4m3(q) * s;
    }
  } else {
    float s;
    if (R == rule::fp4_pow2) {
      s = fp4_pow2_scale(amax);
      if (pack && lane_in_group == 0) rr[d / 2 + g] = pow2_code(s);
    } else {
      const uint8_t code = f32_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f);
      s = e4m3_to_f32(code);
      if (pack && lane_in_group == 0) rr[d / 2 + g] = code;
    }
    const uint8_t c = f32_to_e2m1(v / s);
    const uint8_t next = uint8_t(__shfl_down_sync(0xFFFFFFFFu, uint32_t(c), 1));
    if (pack) {
      if (i % 2 == 0) rr[i / 2] = uint8_t((c & 0xF) | ((next & 0xF) << 4));
    } else {
      x[t] = e2m1_to_f32(c) * s;
    }
  }
}

template <rule R>
__global__ void unpack_kernel(const uint8_t* rec, size_t rec_bytes, int m, int d, float* x) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= (long long)m * d) return;
  const int r = int(t / d), i = int(t % d);
  const uint8_t* rr = rec + size_t(r) * rec_bytes;
  if (R == rule::fp8) {
    x[t] = e4m3_to_f32(rr[i]) * ue8m0_to_f32(rr[d + i / 32]);
  } else {
    const uint8_t code = (rr[i / 2] >> (4 * (i & 1))) & 0xF;
    const float s = R == rule::fp4_pow2 ? ue8m0_to_f32(rr[d / 2 + i / 32]) : e4m3_to_f32(rr[d / 2 + i / 16]);
    x[t] = e2m1_to_f32(code) * s;
  }
}

__global__ void round_bf16_kernel(float* x, size_t n) {
  cuda::detail::dependent_start();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = round_bf16(x[i]);
}

template <rule R>
void run_groups(float* x, int m, int d, uint8_t* rec, size_t rec_bytes, bool pack) {
  CEDAR_CUDA_REQUIRE(d % 32 == 0, "record length is a multiple of 32");
  const long long n = (long long)m * d;
  if (n == 0) return;
  cuda::detail::launch_dependent(group_kernel<R>, dim3(blocks_for(n, 256)), dim3(256), 0, x, m, d, rec, rec_bytes,
                                 pack);
}

template <rule R>
void run_unpack(const uint8_t* rec, size_t rec_bytes, int m, int d, float* x) {
  const long long n = (long long)m * d;
  if (n == 0) return;
  cuda::detail::launch_dependent(unpack_kernel<R>, dim3(blocks_for(n, 256)), dim3(256), 0, rec, rec_bytes, m, d, x);
}

}  // namespace
}  // namespace detail

using namespace detail;

void pack_fp8_rows(const float* x, int m, int d, uint8_t* rec) {
  run_groups<rule::fp8>(const_cast<float*>(x), m, d, rec, size_t(d) + d / 32, true);
}
void unpack_fp8_rows(const uint8_t* rec, int m, int d, float* x) {
  run_unpack<rule::fp8>(rec, size_t(d) + d / 32, m, d, x);
}
void pack_fp4_e4m3_rows(const float* x, int m, int d, uint8_t* rec) {
  run_groups<rule::fp4_e4m3>(const_cast<float*>(x), m, d, rec, size_t(d) / 2 + d / 16, true);
}
void unpack_fp4_e4m3_rows(const uint8_t* rec, int m, int d, float* x) {
  run_unpack<rule::fp4_e4m3>(rec, size_t(d) / 2 + d / 16, m, d, x);
}
void pack_fp4_pow2_rows(const float* x, int m, int d, uint8_t* rec) {
  run_groups<rule::fp4_pow2>(const_cast<float*>(x), m, d, rec, size_t(d) / 2 + d / 32, true);
}
void unpack_fp4_pow2_rows(const uint8_t* rec, int m, int d, float* x) {
  run_unpack<rule::fp4_pow2>(rec, size_t(d) / 2 + d / 32, m, d, x);
}
void fake_quant_fp8_rows(float* x, int m, int d) { run_groups<rule::fp8>(x, m, d, nullptr, 0, false); }
void fake_quant_fp4_pow2_rows(float* x, int m, int d) {
  run_groups<rule::fp4_pow2>(x, m, d, nullptr, 0, false);
}
void fake_quant_fp4_e4m3_rows(float* x, int m, int d) {
  run_groups<rule::fp4_e4m3>(x, m, d, nullptr, 0, false);
}

void round_bf16(float* x, std::size_t n) {
  if (n == 0) return;
  cuda::detail::launch_dependent(round_bf16_kernel, dim3(blocks_for((long long)n, 256)), dim3(256), 0, x, n);
}

}  // namespace cedar::cuda
