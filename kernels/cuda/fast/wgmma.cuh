// Hopper warpgroup MMA (wgmma, sm_90a) for the fast kernel set: shared-memory matrix
// descriptors for the unswizzled core-matrix layout, the fences and the bf16 products the
// kernels use. A core matrix is 8 rows of 16 bytes stored contiguously (128 bytes); for a
// K-major operand its rows run along M or N and its 16 bytes along K, for an MN-major one the
// other way round. A descriptor gives the start, the byte stride between core matrices
// adjacent along K (the leading dimension offset) and between those adjacent along M or N
// (the stride dimension offset). Only sm_90a machine code has these instructions: the bodies
// trap in any other compilation, and hosts check the device's compute capability (9.0) first.
#pragma once

#include <cstdint>

namespace cedar::cuda::fast::wg {

/// True on a device that runs the sm_90a machine code (compute capability 9.0; elsewhere the
/// compute_90 PTX, without wgmma, would be compiled). Host code.
bool available();

/// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

/// Descriptor of an unswizzled operand at shared-memory address `a` (16-byte aligned): k_stride
/// and mn_stride in bytes, multiples of 16.
__device__ __forceinline__ uint64_t desc_at(uint32_t a, uint32_t k_stride, uint32_t mn_stride) {
  return uint64_t((a >> 4) & 0x3FFF) | uint64_t((k_stride >> 4) & 0x3FFF) << 16 |
         uint64_t((mn_stride >> 4) & 0x3FFF) << 32;
}

/// Descriptor of a K-major operand in the 128-byte swizzle at shared-memory address `a`: rows of
/// 64 bf16 (128 bytes) one after another, 16-byte piece c of row r stored as piece c ^ (r % 8);
/// the 8-row groups 1024 bytes apart, the tile 1024-byte aligned. `a` may point 32 k-bytes into
/// the rows (the k16 steps of a row): the hardware swizzles the addresses it forms.
__device__ __forceinline__ uint64_t desc_swizzled(uint32_t a) {
  return uint64_t((a >> 4) & 0x3FFF) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

/// Byte offset of piece `piece` (8 bf16) of row `row` of a K-major tile in the 128-byte swizzle.
__host__ __device__ constexpr uint32_t swizzle128(int row, int piece) {
  return uint32_t(row * 128 + ((piece ^ (row & 7)) * 16));
}

/// Byte offset of element (row, col) of a K-major tile with `cols` columns (K) in core matrices:
/// the core matrices of 8 rows follow each other along K, then the next 8 rows.
__host__ __device__ constexpr uint32_t core_offset(int row, int col, int cols) {
  return uint32_t(((row >> 3) * (cols >> 3) + (col >> 3)) * 128 + (row & 7) * 16 + (col & 7) * 2);
}

/// Shared-memory writes of the generic proxy made visible to wgmma's (async proxy) reads; each
/// writing thread runs it before the barrier that precedes the wgmma.
__device__ __forceinline__ void fence_smem() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Before a warpgroup's first wgmma whose accumulators other instructions wrote.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

/// Commits the issued wgmmas as a group and waits until every group is done.
__device__ __forceinline__ void commit_and_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

/// Commits the issued wgmmas as a group and waits until at most N groups are pending.
template <int N>
__device__ __forceinline__ void commit_and_wait_for() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/// Waits until every committed group of wgmmas is done.
__device__ __forceinline__ void wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

/// Keeps the compiler from moving accesses of v across a wgmma that reads or writes it.
__device__ __forceinline__ void pin(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// The accumulator operands of the wgmma wrappers below: CEDAR_WG_D<N> the register list of N
// fp32 accumulators (%0 .. %N-1) in the instruction text, CEDAR_WG_OUT<N>(d) their operands.
#define CEDAR_WG_D8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define CEDAR_WG_D16 CEDAR_WG_D8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define CEDAR_WG_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CEDAR_WG_D64 CEDAR_WG_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
                     "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CEDAR_WG_D128                                                                                        \
  CEDAR_WG_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
               "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "   \
               "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, "   \
               "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define CEDAR_WG_OUT8(d, i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define CEDAR_WG_OUT16(d) CEDAR_WG_OUT8(d, 0), CEDAR_WG_OUT8(d, 8)
#define CEDAR_WG_OUT32(d) CEDAR_WG_OUT8(d, 0), CEDAR_WG_OUT8(d, 8), CEDAR_WG_OUT8(d, 16), CEDAR_WG_OUT8(d, 24)
#define CEDAR_WG_OUT64(d) \
  CEDAR_WG_OUT32(d), CEDAR_WG_OUT8(d, 32), CEDAR_WG_OUT8(d, 40), CEDAR_WG_OUT8(d, 48), CEDAR_WG_OUT8(d, 56)
#define CEDAR_WG_OUT128(d) \
  CEDAR_WG_OUT64(d), CEDAR_WG_OUT8(d, 64), CEDAR_WG_OUT8(d, 72), CEDAR_WG_OUT8(d, 80), CEDAR_WG_OUT8(d, 88), \
      CEDAR_WG_OUT8(d, 96), CEDAR_WG_OUT8(d, 104), CEDAR_WG_OUT8(d, 112), CEDAR_WG_OUT8(d, 120)

/// D (64 x 64, fp32) = A (64 x 16, K-major) B (16 x 64, K-major) + D when accumulate, bf16
/// operands from shared memory. Thread t of the warpgroup holds rows 16 (t / 32) + (t % 32) / 4
/// and 8 below it, columns 8 j + 2 (t % 4) + {0, 1} in d[4 j + {0, 1}] and d[4 j + {2, 3}].
__device__ __forceinline__ void mma_m64n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" CEDAR_WG_D32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : CEDAR_WG_OUT32(d)
      : "l"(a), "l"(b), "r"(accumulate));
#else
  __trap();
#endif
}

/// The same with N = 256, B K-major (TransB = 0) or MN-major (1: B's 16 x 256 tile stored with N
/// contiguous).
template <int TransB>
__device__ __forceinline__ void mma_m64n256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" CEDAR_WG_D128 "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
      : CEDAR_WG_OUT128(d)
      : "l"(a), "l"(b), "r"(accumulate), "n"(TransB));
#else
  __trap();
#endif
}

/// D (64 x N, fp32) += A (64 x 16, bf16 from registers) B (16 x N, K-major, from shared memory),
/// N = 16, 32, 64, 128 or 256. A's registers as mma.sync m16n8k16's per warp (warp w of the warpgroup:
/// rows 16 w .. 16 w + 15): a0 row g, columns 2 l, 2 l + 1; a1 row g + 8; a2 and a3 the same at
/// columns + 8 (g = lane / 4, l = lane % 4; the lower column in the low half). D as in
/// mma_m64n64 (columns 8 j + 2 l + {0, 1} in d[4 j + {0, 1}], row g + 8 in d[4 j + {2, 3}]).
/// The registers must stay as they are until the wgmma is done (wait for its group).
template <int N>
__device__ void mma_rs(float (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t b);

// One specialization of mma_rs: its accumulators' register list D and operands OUT, and the
// operand numbers of a0 .. a3 (A), b (B) and the accumulate flag (P) in the instruction text.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CEDAR_WG_MMA_RS_BODY(N, D, OUT, A, B, P)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                                   \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D "}, {" A "}, %" B ", p, 1, 1, 0;\n}\n" \
               : OUT(d)                                                                                              \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
#else
#define CEDAR_WG_MMA_RS_BODY(N, D, OUT, A, B, P) __trap();
#endif
#define CEDAR_WG_MMA_RS(N, D, OUT, A, B, P)                                                                   \
  template <>                                                                                                 \
  __device__ __forceinline__ void mma_rs<N>(float (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, \
                                            uint64_t b) {                                                     \
    CEDAR_WG_MMA_RS_BODY(N, D, OUT, A, B, P)                                                                  \
  }

#define CEDAR_WG_OUT8_0(d) CEDAR_WG_OUT8(d, 0)
CEDAR_WG_MMA_RS(16, CEDAR_WG_D8, CEDAR_WG_OUT8_0, "%8, %9, %10, %11", "12", "13")
CEDAR_WG_MMA_RS(32, CEDAR_WG_D16, CEDAR_WG_OUT16, "%16, %17, %18, %19", "20", "21")
CEDAR_WG_MMA_RS(64, CEDAR_WG_D32, CEDAR_WG_OUT32, "%32, %33, %34, %35", "36", "37")
CEDAR_WG_MMA_RS(128, CEDAR_WG_D64, CEDAR_WG_OUT64, "%64, %65, %66, %67", "68", "69")
CEDAR_WG_MMA_RS(256, CEDAR_WG_D128, CEDAR_WG_OUT128, "%128, %129, %130, %131", "132", "133")

}  // namespace cedar::cuda::fast::wg
