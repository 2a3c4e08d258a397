// The routed experts' products at prefill on Hopper (experts_wg.hpp, sm_90a): every expert's
// rows against its FP4 weight in one launch, the weight turned into bf16 in registers on its way
// to the tensor cores, instead of a dequantized bf16 copy of each expert per call and one cuBLAS
// product per expert.
//
// A block computes 128 outputs (weight rows) for BM of one expert's sorted rows (tokens: 16, 32,
// 64, 128 or 256, by the rows an expert has on average), K in steps of 64: two warpgroups, each
// wgmma m64nBMk16 with 64 weight rows as A, from registers, and the tokens as B, from shared
// memory (BM / 2 fp32 accumulators a thread; BM <= 128 runs two blocks a SM). Per step, a tensor
// copy (tma.cuh) brings the tokens' bf16 activations (K-major, 128-byte rows in the 128-byte swizzle)
// and cp.async the weight's packed E2M1 codes into one of `stages` slots, `ahead` steps before
// use. Each thread turns the 32 codes of its A fragments (two rows, 16 columns: 8 bytes of each
// row, the activations' columns stored in the matching order, wg_column) into bf16 by byte-permute
// table lookups and one bf16 multiply by the block's UE8M0 scale (the product is the value,
// exactly), and hands them to the wgmma straight from registers: no bf16 weight tile in shared
// memory, no barrier between the conversion and the product. Every product of two bf16 values is
// exact in fp32, so the results are the CPU op's sums in another order, as with the cuBLAS path.
//
// Tiles are found from the experts' row counts on the device (no host round trip): tile row y is
// the y-th BM-row piece in expert order; blocks past the last piece return at once.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/cuda/fast/mma.cuh"
#include "kernels/cuda/fast/tma.cuh"
#include "kernels/cuda/fast/wgmma.cuh"

namespace cedar::cuda::fast::detail {
namespace {

using cuda::detail::aligned16;

constexpr int bn = 128, bk = 64, threads = 256;
constexpr int r_bytes = bn * bk / 2;  // a slot's weight codes, E2M1

/// The shapes of a block of BM tokens (16, 32, 64, 128 or 256).
template <int BM>
struct tiles {
  static constexpr int a_bytes = BM * bk * 2;  // a slot's activations, bf16
  static constexpr int slot_bytes = a_bytes + r_bytes;
  static_assert(slot_bytes % 1024 == 0, "slots on the swizzle's 1024-byte alignment");
  // slots: 8 where they fit beside the blocks a SM (a power of two: a step's slot and phase
  // are a mask and a shift, not a division in every step), else 5
  static constexpr int stages = BM <= 64 ? 8 : 5;
  static constexpr int ahead = stages - 2;                       // steps loaded before their use
  static_assert(ahead >= 1 && ahead < stages, "a step in flight beside the one in use");
  static constexpr int smem_bytes = stages * slot_bytes + 1024;  // + alignment
  static constexpr int min_blocks = BM <= 128 ? 2 : 1;         // blocks a SM (registers, memory)
};

struct tile_place {
  int expert, row0, rows;  // expert -1: no tile
};

/// Warp 0: the expert, first sorted row and row count of bm-row piece `tile` (pieces in expert
/// order, each expert's rows following the rows of the experts before it).
[[maybe_unused]] __device__ tile_place find_tile(const int* counts, int num_experts, int tile, int bm) {
  const int lane = threadIdx.x & 31;
  int tiles_before = 0, rows_before = 0;
  for (int base = 0; base < num_experts; base += 32) {
    const int c = base + lane < num_experts ? counts[base + lane] : 0;
    const int t = (c + bm - 1) / bm;
    int t_incl = t, c_incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int tu = __shfl_up_sync(0xFFFFFFFFu, t_incl, o), cu = __shfl_up_sync(0xFFFFFFFFu, c_incl, o);
      if (lane >= o) t_incl += tu, c_incl += cu;
    }
    const int first = tiles_before + t_incl - t;
    const bool mine = tile >= first && tile < first + t;
    const unsigned hit = __ballot_sync(0xFFFFFFFFu, mine);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      const int piece = tile - __shfl_sync(0xFFFFFFFFu, first, src);
      const int cnt = __shfl_sync(0xFFFFFFFFu, c, src);
      const int row0 = rows_before + __shfl_sync(0xFFFFFFFFu, c_incl - c, src) + piece * bm;
      return {base + src, row0, min(bm, cnt - piece * bm)};
    }
    tiles_before += __shfl_sync(0xFFFFFFFFu, t_incl, 31);
    rows_before += __shfl_sync(0xFFFFFFFFu, c_incl, 31);
  }
  return {-1, 0, 0};
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

/// The low words of decode8's two byte tables (see there), as registers: the high words go into
/// the permutes as immediates, and a permute takes one. Read from shared memory by an asm load
/// (load_tables), so that no compiler pass knows their values: as constants they were copied
/// into a fresh register before every permute (16 moves a step).
struct decode_tables {
  uint32_t lo, hi;
};

[[maybe_unused]] __device__ __forceinline__ decode_tables load_tables(const decode_tables* shared) {
  decode_tables t;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(t.lo), "=r"(t.hi)
               : "r"(wg::smem_address(shared))
               : "memory");
  return t;
}

/// Eight E2M1 codes (low nibble first) as four bf16 pairs, each times the bf16 pair `scale`.
/// Byte permutes do the table lookups: the codes' magnitudes (3 bits) select the low and the high
/// bytes of the bf16 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 from two 8-byte tables (t.lo = 0xC0800000
/// beside 0xC0804000, t.hi = 0x3F3F3F00 beside 0x40404040), the sign bits are gathered into bit 7
/// of the high bytes, and two more permutes interleave low and high bytes.
[[maybe_unused]] __device__ __forceinline__ uint4 decode8(uint32_t w, uint32_t scale, decode_tables t) {
  const uint32_t mags = w & 0x77777777u, w4 = w << 4;
  uint32_t o[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // codes 4h .. 4h + 3
    const uint32_t sel = h ? mags >> 16 : mags;
    const uint32_t lo = __byte_perm(t.lo, 0xC0804000u, sel);
    // a code's sign is bit 7 of byte i of w (odd codes) or of w << 4 (even codes)
    const uint32_t sign = __byte_perm(w, w4, h ? 0x3726u : 0x1504u);
    const uint32_t hi = __byte_perm(t.hi, 0x40404040u, sel) | (sign & 0x80808080u);
    o[2 * h] = mul_bf16x2(__byte_perm(lo, hi, 0x5140u), scale);
    o[2 * h + 1] = mul_bf16x2(__byte_perm(lo, hi, 0x7362u), scale);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

struct wg_params {
  const int* counts;  // [num_experts] (the activations [sorted rows, k] bf16: the tensor map)
  const cpu::expert_weights* table;
  int num_experts, which, n, k;
  float* y;
  int ldy;
};

template <int BM>
__global__ void __launch_bounds__(threads, tiles<BM>::min_blocks)
    experts_wg_kernel(const __grid_constant__ CUtensorMap a_map, wg_params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int a_bytes = tiles<BM>::a_bytes, slot_bytes = tiles<BM>::slot_bytes;
  constexpr int stages = tiles<BM>::stages, ahead = tiles<BM>::ahead;
  extern __shared__ __align__(128) uint8_t smem_raw[];  // (1024-byte aligned below: the swizzle)
  uint8_t* smem = smem_raw + ((1024 - wg::smem_address(smem_raw) % 1024) % 1024);
  __shared__ tile_place place;
  __shared__ __align__(8) decode_tables tables;
  __shared__ __align__(8) uint64_t full[stages];  // a slot's activations have landed
  const int tid = threadIdx.x, n0 = blockIdx.x * bn;
  if (tid == 0) {
    for (int i = 0; i < stages; ++i) tma::init(&full[i], 1);
    tma::fence_init();
    tables = {0xC0800000u, 0x3F3F3F00u};
  }
  cuda::detail::grid_dependency_wait();  // the counts and rows come from the kernels before
  if (tid < 32) {
    const tile_place t = find_tile(p.counts, p.num_experts, int(blockIdx.y), BM);
    if (tid == 0) place = t;
  }
  __syncthreads();
  const tile_place t = place;
  if (t.expert < 0) return;
  const decode_tables tab = load_tables(&tables);
  const cpu::expert_weights& ew = p.table[t.expert];
  const bool up = p.which == 0, second = up && n0 >= p.n / 2;
  const fp4_weight& w = up ? (second ? ew.w3 : ew.w1) : ew.w2;
  const int wrow = second ? n0 - p.n / 2 : n0;
  const int k = p.k, steps = k / bk;
  // the codes: thread tid copies half tid % 2 of weight row tid / 2's 32 bytes a step
  const uint8_t* r_src = w.data + std::size_t(wrow + (tid >> 1)) * (k / 2) + (tid & 1) * 16;
  // Each load first advances the code source to its step (a pointer written well before the
  // cp.async reads it, not right after, where the write would wait for the copy to take its
  // address), then copies into the step's slot.
  const uint32_t smem_base = wg::smem_address(smem);
  const uint64_t desc0 = wg::desc_swizzled(smem_base);
  const auto load = [&](int step, bool advance) {
    r_src += advance ? bk / 2 : 0;
    const uint32_t slot = smem_base + (step % stages) * slot_bytes;
    if (tid == 0) {  // the activations: one tensor copy (rows past this expert's are not stored)
      tma::arrive_expect(&full[step % stages], a_bytes);
      tma::load_2d(slot, &a_map, step * bk, t.row0, &full[step % stages]);
    }
    cp_async16(slot + a_bytes + tid * 16, r_src, true);
  };
  // the weight rows of this thread's fragments (rows g and g + 8 of its warp's 16), the codes of
  // columns 16 l .. 16 l + 15 of each step (one scale block), scales read two steps at a time
  const int wgi = tid >> 7, lane = tid & 31, g = lane >> 2, l = lane & 3;
  const int frag_row = 64 * wgi + 16 * ((tid >> 5) & 3) + g;
  const uint32_t* scales_of[2] = {
      reinterpret_cast<const uint32_t*>(w.scale + std::size_t(wrow + frag_row) * (k / 32)),
      reinterpret_cast<const uint32_t*>(w.scale + std::size_t(wrow + frag_row + 8) * (k / 32))};

  float acc[BM / 2];
#pragma unroll
  for (float& v : acc) v = 0.0f;
#pragma unroll
  for (int s = 0; s < ahead; ++s) {
    if (s < steps) load(s, s > 0);
    cp_async_commit();
  }
  uint32_t scales2[2] = {}, scales_next[2] = {__ldg(scales_of[0]), __ldg(scales_of[1])};
  uint32_t frags[2][16];  // a step's A fragments, two steps' sets: a wgmma reads them until done

  const auto step = [&](int s, uint32_t(&a)[16]) {
    cp_async_wait<ahead - 1>();
    __syncthreads();  // step s's codes have landed; every wgmma of step s - 2 is done (slot free)
    const uint8_t* codes = smem + (s % stages) * slot_bytes + a_bytes + 8 * l;
    const uint2 c0 = *reinterpret_cast<const uint2*>(codes + frag_row * 32),
                c1 = *reinterpret_cast<const uint2*>(codes + (frag_row + 8) * 32);
    if (s % 2 == 0)
      for (int r = 0; r < 2; ++r) {
        scales2[r] = scales_next[r];
        if (s + 2 < steps) scales_next[r] = __ldg(scales_of[r] + (s + 2) / 2);
      }
    if (s + ahead < steps) load(s + ahead, true);
    cp_async_commit();
    // the scale block of columns 16 l .. 16 l + 15 of step s: byte 2 (s % 2) + l / 2 of the two
    // steps' four; 2^(e - 127) as a bf16 pair, e << 7 in each half (e = 0: the subnormal 2^-127)
    const int byte = 2 * (s & 1) + (l >> 1);
    uint32_t scale[2];
    for (int r = 0; r < 2; ++r) {
      const uint32_t e = __byte_perm(scales2[r], 0u, 0x4440u | uint32_t(byte));  // bytes 1-3: zeros
      scale[r] = e ? e * 0x00800080u : 0x00400040u;
    }
    // byte i of a row's 8 holds columns 16 l + 2 i, + 1: the pair that k16 step i / 2 takes at
    // a0 (row g) / a1 (row g + 8) for even i, a2 / a3 for odd i (wg_column's order)
    const uint4 r0[2] = {decode8(c0.x, scale[0], tab), decode8(c0.y, scale[0], tab)};
    const uint4 r1[2] = {decode8(c1.x, scale[1], tab), decode8(c1.y, scale[1], tab)};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a[8 * h + 0] = r0[h].x, a[8 * h + 1] = r1[h].x, a[8 * h + 2] = r0[h].y, a[8 * h + 3] = r1[h].y;
      a[8 * h + 4] = r0[h].z, a[8 * h + 5] = r1[h].z, a[8 * h + 6] = r0[h].w, a[8 * h + 7] = r1[h].w;
    }
    // the tile's descriptor: the first slot's plus the slot's offset, then 32 bytes (2 units of
    // the 14-bit address field, which no slot overflows) a k16 step
    const uint64_t tile = desc0 + uint64_t((s % stages) * (slot_bytes >> 4));
    tma::wait(&full[s % stages], uint32_t(s / stages) & 1);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < bk / 16; ++kk)
      wg::mma_rs<BM>(acc, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3], tile + uint64_t(2 * kk));
    wg::commit_and_wait_for<1>();
  };
  for (int s = 0; s < steps; s += 2) {  // steps % 2 == 0; the fragment sets alternate
    step(s, frags[0]);
    step(s + 1, frags[1]);
  }
  wg::wait_all();
  for (float& v : acc) wg::pin(v);

  // acc[4 j + {0, 1}]: weight row frag_row, tokens 8 j + 2 l + {0, 1}; acc[4 j + {2, 3}]: row + 8
  float* y0 = p.y + std::size_t(t.row0) * p.ldy + n0 + frag_row;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = 8 * j + 2 * l + c;
      if (tok < t.rows) {
        y0[std::size_t(tok) * p.ldy] = acc[4 * j + c];
        y0[std::size_t(tok) * p.ldy + 8] = acc[4 * j + 2 + c];
      }
    }
#endif
}

}  // namespace

bool experts_wg_supports(const cpu::expert_weights* experts, int num_experts, int d, int inter) {
  // n (2 inter or d) a multiple of bn, k (d or inter) of 2 bk: the steps run in pairs
  if (d % bn != 0 || inter % bn != 0 || d % (2 * bk) != 0 || inter % (2 * bk) != 0 || !wg::available()) return false;
  for (int e = 0; e < num_experts; ++e) {
    const cpu::expert_weights& w = experts[e];
    for (const fp4_weight* m : {&w.w1, &w.w3, &w.w2})
      if (m->data != nullptr && (!aligned16(m->data) || reinterpret_cast<uintptr_t>(m->scale) % 4 != 0)) return false;
  }
  return true;
}

namespace {

/// The tensor map of a [rows, k] bf16 row-major matrix in boxes of bm rows by bk columns, in
/// the 128-byte swizzle; rows past the last read as zeros.
CUtensorMap activation_map(const uint16_t* a, int rows, int k, int bm) {
  using encode_fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const encode_fn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CEDAR_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    CEDAR_CUDA_REQUIRE(found == cudaDriverEntryPointSuccess && fn != nullptr, "cuTensorMapEncodeTiled not found");
    return reinterpret_cast<encode_fn>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)}, strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {bk, cuuint32_t(bm)}, unit[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(a), dims, strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CEDAR_CUDA_REQUIRE(r == CUDA_SUCCESS, "experts_wg: cuTensorMapEncodeTiled failed");
  return map;
}

template <int BM>
void launch_wg(const uint16_t* a, const int* counts, const cpu::expert_weights* table, int num_experts, int which,
               int n, int k, int slots, float* y, int ldy) {
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(experts_wg_kernel<BM>), tiles<BM>::smem_bytes);
  // at most one partial piece per expert beyond the whole ones
  const long long pieces = (slots + BM - 1) / BM + num_experts;
  CEDAR_CUDA_REQUIRE(pieces <= 65535, "experts_wg: at most 65535 row pieces");
  cuda::detail::launch_dependent(experts_wg_kernel<BM>, dim3(unsigned(n / bn), unsigned(pieces)), dim3(threads),
                                 tiles<BM>::smem_bytes, activation_map(a, slots, k, BM),
                                 wg_params{counts, table, num_experts, which, n, k, y, ldy});
}

}  // namespace

void experts_wg(const uint16_t* a, const int* counts, const cpu::expert_weights* table, int num_experts, int which,
                int n, int k, int slots, float* y, int ldy, int tile_tokens) {
  CEDAR_CUDA_REQUIRE(n % bn == 0 && k % (2 * bk) == 0 && ldy % 2 == 0 && aligned16(a) && aligned16(y),
                     "experts_wg: n % 128 == 0, k % 128 == 0, aligned rows");
  if (slots <= 0) return;
  CEDAR_CUDA_REQUIRE(tile_tokens == 0 || is_wg_tile(tile_tokens), "experts_wg: tiles of 16, 32, 64, 128 or 256 tokens");
  // the token tile by the rows an expert has on average: every block multiplies its whole tile.
  // 16 rows up to 11 an expert: past that, an expert's spread over two 16-row pieces costs more
  // than the 32-row tile's padding (bench-40L-E64 decode, ms a step, 16 / 32: batch 112 (10.5 an
  // expert) 50.34 / 51.04, batch 128 (12) 52.15 / 51.43)
  const int avg = slots / std::max(num_experts, 1);
  const int tile = tile_tokens ? tile_tokens
                   : avg <= 11 ? 16
                   : avg <= 32 ? 32
                   : avg <= 64 ? 64
                   : avg <= 160 ? 128
                                : 256;
  switch (tile) {
    case 16:
      return launch_wg<16>(a, counts, table, num_experts, which, n, k, slots, y, ldy);
    case 32:
      return launch_wg<32>(a, counts, table, num_experts, which, n, k, slots, y, ldy);
    case 64:
      return launch_wg<64>(a, counts, table, num_experts, which, n, k, slots, y, ldy);
    case 128:
      return launch_wg<128>(a, counts, table, num_experts, which, n, k, slots, y, ldy);
    default:
      return launch_wg<256>(a, counts, table, num_experts, which, n, k, slots, y, ldy);
  }
}

}  // namespace cedar::cuda::fast::detail
