// `cedar kernel-lab`: what the lab's files share. kernel_lab.cpp is the command (ceilings,
// decode floor, report), kernel_lab_gemm.cpp the GEMM cases (every variant checked against the
// CPU op on sampled rows, then timed with the weights rotated through copies larger than L2) and
// the helpers declared below, kernel_lab_gemv.cpp the bf16 GEMV's cases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#ifdef CEDAR_HAVE_CUDA
#include "kernels/cuda/cuda_ops.hpp"
#endif

namespace cedar::lab {

/// One timed variant of one op at one shape.
struct lab_case {
  std::string op;       ///< linear_fp8, linear_fp4, moe_up, moe_down
  std::string variant;  ///< gemv, skinny, wide, quant, baseline (the exact CUDA op), cublaslt
  std::string shape;    ///< the weight's name in the model
  int m = 0, n = 0, k = 0;
  int groups = 1;             ///< experts touched (grouped ops)
  double time_us = 0;         ///< mean per call inside a CUDA graph (device time)
  double eager_us = 0;        ///< mean per call launched one by one from the host
  double bytes = 0;           ///< bytes a call must move (weights, activations, output)
  double flops = 0;           ///< 2 m n k
  bool checked = false;       ///< compared with the CPU op
  bool pass = true;           ///< every checked output within the bound
  double max_err_ratio = 0;   ///< max |y - y_cpu| / sum_k |xq_k w_k|
  bool same_bits = true;      ///< bit-identical to the op's first fast variant (batch invariance)
};

/// |y - y_cpu| <= err_bound * sum_k |xq_k w_k| (2^-16) for every checked output of a fast variant.
constexpr double err_bound = 1.0 / 65536;

/// A weight of the linear cases: its name in the model, out x in.
struct linear_shape {
  const char* name;
  int n, k;
};
inline constexpr linear_shape fp8_shapes[] = {{"attn.wq_a", 1280, 5120}, {"attn.wq_b", 32768, 1280},
                                              {"attn.wkv", 512, 5120},   {"attn.wo_b", 5120, 8192},
                                              {"shared.w1", 2304, 5120}, {"shared.w2", 5120, 2304},
                                              {"shared.w13", 4608, 5120}, {"square", 5120, 5120}};
inline constexpr linear_shape fp4_shapes[] = {{"expert.w13", 4608, 5120}, {"expert.w2", 5120, 2304}};

/// GEMM cases of the real V4.1 shapes; quick keeps fewer row counts.
/// shape: that weight only (its name in the lab's table, e.g. attn.wq_b), or every weight.
std::vector<lab_case> run_linear_cases(bool fp4, bool quick, const std::string& shape = {});
/// --op moe narrowed to one token count and/or one tile (0 / empty: all).
struct moe_filter {
  int tokens = 0;
  std::string tile;
};
/// Grouped W4A8 expert GEMMs (64 experts, top-6) for 1, 16, 64, 256 and 8192 tokens.
std::vector<lab_case> run_moe_cases(bool quick, const moe_filter& filter = {});
/// Decode attention and indexer at 8K context, batch 1/64/256, FP4 and FP8 KV: fused vs exact.
std::vector<lab_case> run_attention_cases(bool quick);
/// The mHC boundary (kernel_lab_mhc.cpp): fast::hc_boundary in one and two launches against
/// the exact CUDA ops at 1, 2, 8 and 64 rows of the V4.1 residual (4 x 5120).
std::vector<lab_case> run_mhc_cases(bool quick);
/// The fast kernel set's prefill path (fast::linear_fp8/fp4 at m = 8192 with its parts and
/// cuBLASLt FP8 at the same shape), a threshold sweep (gemv vs bf16 path, m = 16..256), the bf16
/// GEMV at m = 1 (head, wo_a, router, compressor) and fast::moe_ffn at 8192 tokens; with
/// moe_tokens > 0, only fast::moe_ffn at that count.
std::vector<lab_case> run_prefill_cases(bool quick, int moe_tokens = 0);
/// The bf16 GEMV of the decode step's bf16 and wo_a weights at `rows` rows (0: 1, 2, 4, 8, 16),
/// each m > 1 also in the plain column mode ("gemv.unstaged", which must keep the bits).
std::vector<lab_case> run_gemv_cases(int rows = 0);

#ifdef CEDAR_HAVE_CUDA
/// The GEMM and GEMV cases' random numbers (splitmix64).
struct lab_rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
};

/// Activations with a different magnitude per group of 32, so the FP8 scales differ.
std::vector<float> random_x(std::size_t rows, int k, lab_rng& r);

/// Mean microseconds per call of fn(i), in a CUDA graph and launched one by one, iterations
/// chosen for about 10 ms of work.
void time_case(const std::function<void(int)>& fn, lab_case& c);

/// Weight bytes a case rotates through (copies), so that every call reads its weight from HBM:
/// 256 MB, or 0 (one copy, the weight left in the 50 MB L2 between calls: what a weight fetched
/// into L2 ahead of its reader could give) with CEDAR_LAB_L2_WARM=1.
std::size_t l2_defeat_bytes();

/// The decode step's bf16 GEMV weights (head, wo_a in both forms, router gate, compressor) at m
/// rows (kernel_lab_gemv.cpp).
void run_gemv_weights(int m, lab_rng& r, std::vector<lab_case>& out);

/// Device buffer of `bytes`, freed on scope exit.
struct dev_buf {
  void* p = nullptr;
  explicit dev_buf(std::size_t bytes) : p(cuda::device_alloc(bytes)) {}
  ~dev_buf() { cuda::device_free(p); }
  dev_buf(const dev_buf&) = delete;
  dev_buf& operator=(const dev_buf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

/// A device buffer of n T's, freed on scope exit.
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t count)
      : p(static_cast<T*>(cuda::device_alloc(std::max<std::size_t>(count, 1) * sizeof(T)))), n(count) {}
  explicit dbuf(const std::vector<T>& v) : dbuf(v.size()) { cuda::copy_to_device(p, v.data(), v.size() * sizeof(T)); }
  ~dbuf() { cuda::device_free(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::vector<T> host() const {
    std::vector<T> v(n);
    cuda::copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }
};
#endif

}  // namespace cedar::lab
