// Hopper's tensor memory accelerator (TMA, sm_90a) for the fast kernel set: 2D tiles copied from
// global into shared memory by one thread's instruction, their arrival counted in bytes on a
// shared-memory barrier (mbarrier) that the consumers wait on. The tensor map (the tile's shape,
// strides and swizzle) is made on the host (experts_wg.cu) and passed as a __grid_constant__
// kernel parameter. Only sm_90a machine code has these instructions: the bodies are empty in any
// other compilation (hosts check the device first).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/fast/wgmma.cuh"

namespace cedar::cuda::fast::tma {

using wg::smem_address;

/// One thread: barrier `bar` expects `count` arrivals a phase. Then fence_init and a block barrier.
__device__ __forceinline__ void init(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
#endif
}

/// Makes the initialized barriers visible to the async proxy (the copies that complete on them).
__device__ __forceinline__ void fence_init() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/// Arrives on `bar` and adds `bytes` to the bytes its phase waits for.
__device__ __forceinline__ void arrive_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}

/// Copies the box at (c0 inner, c1 outer) of `map` to shared address `dst`, counted on `bar`.
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar))
      : "memory");
#endif
}

/// Waits until phase `parity` (0 or 1) of `bar` is complete.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace cedar::cuda::fast::tma
