// Shared device code of the CUDA backend: error checks, the stream, stream-ordered scratch,
// the number formats of kernels/formats.cpp bit for bit, and the warp dot in the CPU's
// dot_order. Built with --fmad=false, so a*b+c is a rounded product then a rounded sum.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/expf_port.hpp"

namespace cedar::cuda::detail {

/// Aborts with file:line on a CUDA error (a broken device is not recoverable here).
#define CEDAR_CUDA_CHECK(call)                                                         \
  do {                                                                                 \
    const cudaError_t err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #call,   \
                   cudaGetErrorString(err_));                                          \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

/// Checks the launch that just happened.
#define CEDAR_CUDA_LAUNCHED() CEDAR_CUDA_CHECK(cudaGetLastError())

/// Aborts with file:line when a shape invariant is broken.
#define CEDAR_CUDA_REQUIRE(cond, what)                                                 \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   what);                                                              \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

cudaStream_t stream();

/// Set on a thread while it captures a CUDA graph whose edges $CEDAR_GPU_GRAPH_EDGES reports
/// (runtime.cu); otherwise captures note nothing.
extern thread_local bool noting_dependent_nodes;
/// Notes the node a dependent launch just added to the graph `s` captures (runtime.cu).
void note_dependent_node(cudaStream_t s);
/// Set on a thread while it captures a CUDA graph (runtime.cu).
extern thread_local bool capturing_graph;
/// While a graph is captured: `bytes` of the captures' scratch buffer, or null (no room, or no
/// buffer; then the pool's). Scratch from the pool becomes allocation and free nodes of the graph,
/// and a dependent launch behind such a node loses its programmatic edge (runtime.cu).
void* capture_scratch(std::size_t bytes);
/// Whether p is capture scratch (then it is released; nothing else to do).
bool release_capture_scratch(void* p);

/// Stream-ordered scratch of n T's, freed (stream-ordered) when it goes out of scope.
template <class T>
class scratch {
 public:
  explicit scratch(std::size_t n) : n_(n) {
    if (n == 0) return;
    if (capturing_graph) p_ = static_cast<T*>(capture_scratch(n * sizeof(T)));
    from_capture_ = p_ != nullptr;
    if (!p_) CEDAR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), stream()));
  }
  ~scratch() {
    if (p_ && !release_capture_scratch(p_)) cudaFreeAsync(p_, stream());
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  /// From the capture's buffer: valid until the graph's run ends, whichever stream of the graph
  /// reads it (pool scratch is freed on this stream only).
  bool from_capture() const { return from_capture_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
  bool from_capture_ = false;
};

inline unsigned blocks_for(long long n, int threads) { return unsigned((n + threads - 1) / threads); }

/// The current device's SM count (read once per process; the devices a process drives are
/// taken to be of one kind).
inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
    CEDAR_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

/// True when p is 16-byte aligned (a 16-byte vector load or store, cp.async of 16 bytes).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Raises `kernel`'s dynamic shared memory limit to at least `bytes` on the calling thread's
/// current device. The limit belongs to the kernel on each device, so it is kept per (kernel,
/// device), not once per process (a process may drive several devices), and only ever raised:
/// a kernel launched with several sizes keeps the largest (lowering it to a later, smaller
/// size would make the next larger launch fail).
inline void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> limit;
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  int& now = limit[{kernel, dev}];
  if (bytes <= now) return;
  CEDAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  now = bytes;
}

// ---- programmatic dependent launch (sm_90) --------------------------------------------------

/// Launches kernel on the stream so that it may start while the kernel before it finishes
/// (programmatic stream serialization): its blocks run whatever reads only data no kernel
/// writes (weights), then grid_dependency_wait(), before which they must neither read what
/// earlier kernels write nor write anything at all.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  CEDAR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, Params(args)...));
  if (noting_dependent_nodes) note_dependent_node(cfg.stream);
}

/// Waits until the kernels before this one in the stream have finished and their writes are
/// visible (a no-op for a kernel launched the ordinary way).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next kernel of the stream, if launched with launch_dependent, start its blocks.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The first line of a kernel that needs what the kernels before it wrote from the start: waits
/// for them, then lets the next kernel's blocks be scheduled (they wait in turn).
__device__ __forceinline__ void dependent_start() {
  grid_dependency_wait();
  launch_dependents();
}

// ---- formats (kernels/formats.cpp) --------------------------------------------------------

__device__ __forceinline__ float bf16_to_f32(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  if (isnan(x)) return uint16_t((u >> 16) | 0x0040);
  const uint32_t lsb = (u >> 16) & 1;
  return uint16_t((u + 0x7FFF + lsb) >> 16);
}

__device__ __forceinline__ float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/// Two e4m3 codes (the low two bytes of `two`, low byte first) -> their f16 values, exact, as
/// one f16 pair (the hardware conversion).
__device__ __forceinline__ __half2_raw e4m3x2_to_f16x2(uint32_t two) {
  return __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xFFFFu), __NV_E4M3);
}

/// Four e4m3 codes (bytes 0..3 of v) -> two f16 pairs, exact: lo = codes 0, 1; hi = codes 2, 3.
/// The halves go to the conversions as register halves (`mov.b32 {l, h}`), so each is one
/// conversion instruction; e4m3x2_to_f16x2(v >> 16) costs a shift more (larger SASS).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t v, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(v));
}

/// Counter-based 64-bit mixing (splitmix64's step and finalizer).
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The same as floats, exact.
__device__ __forceinline__ float2 e4m3x2_to_f32(uint32_t two) { return __half22float2(__half2(e4m3x2_to_f16x2(two))); }

__device__ __forceinline__ float e4m3_to_f32(uint8_t code) {
  const bool neg = code & 0x80;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return __int_as_float(0x7FC00000);
  const float mag = exp == 0 ? ldexpf(float(mant), -9) : ldexpf(float(8 + mant), exp - 10);
  return neg ? -mag : mag;
}

__device__ __forceinline__ float ue8m0_to_f32(uint8_t code) {
  if (code == 255) return __int_as_float(0x7FC00000);
  return __uint_as_float(max(uint32_t(code) << 23, 0x00400000u));  // 2^(code - 127); code 0: 2^-127
}

__device__ __forceinline__ float e2m1_to_f32(uint8_t code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[code & 7];
  return (code & 8) ? -v : v;
}

__device__ __forceinline__ uint8_t f32_to_e2m1(float x) {
  if (isnan(x)) return 0;
  const uint8_t sign = signbit(x) ? 0x8 : 0x0;
  const float a = fabsf(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  if (isnan(x)) return 0x7F;
  const uint8_t sign = signbit(x) ? 0x80 : 0x00;
  const float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7E;
  int code;
  if (a < 0x1p-6f) {
    code = int(rintf(ldexpf(a, 9)));
  } else {
    int e = 0;
    frexpf(a, &e);
    --e;
    code = ((e + 7) << 3) + int(rintf(ldexpf(a, 3 - e))) - 8;
  }
  return uint8_t(sign | code);
}

__device__ __forceinline__ int ceil_log2(float v) {
  int e = 0;
  const float f = frexpf(v, &e);
  return f == 0.5f ? e - 1 : e;
}

__device__ __forceinline__ float pow2_scale(float amax, float floor_value, float inv_max) {
  if (isnan(amax)) return __int_as_float(0x7FC00000);
  const float v = fmaxf(amax, floor_value) * inv_max;
  if (isinf(v)) return __int_as_float(0x7F800000);
  return ldexpf(1.0f, ceil_log2(v));
}

__device__ __forceinline__ float fp8_group_scale(float amax) { return pow2_scale(amax, 1e-4f, 1.0f / 448.0f); }
__device__ __forceinline__ float fp4_pow2_scale(float amax) { return pow2_scale(amax, 6.0f * 0x1p-126f, 1.0f / 6.0f); }

__device__ __forceinline__ uint8_t pow2_code(float s) {
  int e = 0;
  frexpf(s, &e);
  return uint8_t(e - 1 + 127);
}

__device__ __forceinline__ float round_to_e4m3(float v) {
  const float a = fabsf(v);
  float r;
  if (a < 0x1p-6f) {
    r = __fsub_rn(__fadd_rn(a, 0x1p14f), 0x1p14f);
  } else {
    uint32_t u = __float_as_uint(a);
    u = (u + 0x7FFFF + ((u >> 20) & 1)) & 0xFFF00000u;
    r = __uint_as_float(u);
  }
  return copysignf(r, v);
}

__device__ __forceinline__ float clampf(float x, float lo, float hi) {
  // std::clamp(x, lo, hi): x < lo ? lo : (hi < x ? hi : x)
  return x < lo ? lo : (hi < x ? hi : x);
}

/// std::max(a, b) exactly: (a < b) ? b : a (NaN in b is ignored, NaN in a kept).
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }
/// std::min(a, b) exactly: (b < a) ? b : a.
__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }

/// Group amax as the CPU computes it (std::max over |x| ascending).
__device__ __forceinline__ float group_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std_max(amax, fabsf(x[i]));
  return amax;
}

// ---- transcendentals: exp and log1p as the host libm computes them ---------------------------------------

/// exp with the host C library's algorithm (expf_port.hpp): the CPU reference's bits.
__device__ __forceinline__ float exp_f(float x) { return libm_port::expf(x); }
/// log1p with the host C library's algorithm (expf_port.hpp).
__device__ __forceinline__ float log1p_f(float x) { return libm_port::log1pf(x); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + exp_f(-x)); }
/// The clamped SwiGLU of one value pair, as the CPU op: silu(min(g, limit)) * clamp(u, +-limit).
__device__ __forceinline__ float swiglu_f(float g, float u, float limit) {
  return silu_f(std_min(g, limit)) * clampf(u, -limit, limit);
}

/// group_amax over a group of G lanes (G a power of two <= 32, the group's lanes adjacent), to
/// every lane of it: std::max from 0 as the CPU takes it (a NaN value does not count).
template <int G>
__device__ __forceinline__ float group_amax_lanes(float v) {
  float amax = std_max(0.0f, fabsf(v));
  for (int off = G / 2; off > 0; off /= 2) amax = std_max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  return amax;
}

/// quantize_rows_fp8's rule for a group of 32 values, one a lane (the whole warp calls it): the
/// group's power-of-two scale (to every lane) and this lane's e4m3 code.
__device__ __forceinline__ float fp8_group_code(float v, uint8_t& code) {
  float amax = fabsf(v);
  for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float s = fp8_group_scale(amax);
  code = f32_to_e4m3(clampf(v / s, -448.0f, 448.0f));
  return s;
}

/// fmt::fake_quant_fp8 of 8 values of a group of 32 that four adjacent lanes hold (8 each), as
/// 8 bf16 (exact) packed low half first; the group's amax is folded over the four lanes, so the
/// whole warp calls it (a lane past the data passes zeros and drops the result).
__device__ __forceinline__ uint4 fake_quant8_bf16(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float s = fp8_group_scale(group_amax_lanes<4>(amax)), inv = 1.0f / s;  // a power of two: v * inv == v / s
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float q0 = round_to_e4m3(clampf(v[2 * i] * inv, -448.0f, 448.0f)) * s;
    const float q1 = round_to_e4m3(clampf(v[2 * i + 1] * inv, -448.0f, 448.0f)) * s;
    o[i] = uint32_t(f32_to_bf16(q0)) | (uint32_t(f32_to_bf16(q1)) << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// ---- RoPE ------------------------------------------------------------------------------------

constexpr int max_rope_half = 128;
/// A launch's RoPE frequencies (rope_frequencies, internal.cuh), by value.
struct rope_table {
  double freqs[max_rope_half];
};

/// cos and sin of pair i at position pos, in double and rounded once (as the CPU); inverse
/// rotates the other way.
__device__ __forceinline__ void rope_cos_sin(double pos, double freq, bool inverse, float& c, float& s) {
  const double angle = pos * freq;
  c = float(cos(angle));
  s = inverse ? -float(sin(angle)) : float(sin(angle));
}

/// The pair (a, b) rotated by (c, s) into v[0], v[1] (the CPU's products and sums).
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float* v) {
  v[0] = a * c - b * s;
  v[1] = a * s + b * c;
}

// ---- the warp dot in dot_order ---------------------------------------------------------------

/// Folds the 32 lane partials as the CPU folds its two 16-lane accumulators: lane l + lane l+16,
/// then halves 8, 4, 2, 1. Every lane must call it; lane 0 holds the result.
__device__ __forceinline__ float warp_fold(float v) {
  for (int off = 16; off >= 1; off /= 2) v = v + __shfl_down_sync(0xFFFFFFFFu, v, off);
  return v;
}

/// out[i] = (in[i] * inv) * w[i] for i = first, first + stride, ... below n (in == out allowed):
/// U positions' loads are issued before any is stored, so a thread waits one memory latency per
/// U positions (in place, the compiler could not hoist a load over a store itself).
template <int U>
__device__ __forceinline__ void scale_by_weight(const float* in, float* out, int n, int first, int stride, float inv,
                                                const float* w) {
  for (int i0 = first; i0 < n; i0 += stride * U) {
    float xv[U], wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * stride;
      xv[u] = i < n ? in[i] : 0.0f;
      wv[u] = i < n ? w[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < n) out[i0 + u * stride] = (xv[u] * inv) * wv[u];
  }
}

/// dot(a, b) of length n in dot_order, by one whole warp; the result is returned to every lane.
__device__ __forceinline__ float warp_dot(const float* a, const float* b, int n) {
  const int lane = threadIdx.x & 31;
  const int n32 = n - n % 32;
  float acc = 0.0f;
  // unrolled so that several loads are in flight (the adds keep their order)
#pragma unroll 8
  for (int k = lane; k < n32; k += 32) acc = acc + a[k] * b[k];
  float s = warp_fold(acc);
  if (lane == 0)
    for (int k = n32; k < n; ++k) s = s + a[k] * b[k];
  return __shfl_sync(0xFFFFFFFFu, s, 0);
}

}  // namespace cedar::cuda::detail
