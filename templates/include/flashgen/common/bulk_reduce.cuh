// Hopper's bulk reduce-add (the TMA engine, no tensor map): a contiguous span of fp32 in shared
// memory added to global memory by one instruction, asynchronously. The backward adds each
// step's dQ to the fp32 workspace this way: the copy engine does the adds while the warps
// compute the next step, instead of every thread queueing atomics on the load/store unit.
#pragma once

#include <cuda_runtime.h>

namespace flashgen {

// Makes this thread's ordinary shared-memory writes visible to bulk copies that a barrier
// orders after them.
__device__ __forceinline__ void fence_for_bulk_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// global[0, bytes) += shared[0, bytes), fp32; both 16-byte aligned, bytes a multiple of 16.
// Completes asynchronously: wait_bulk_reads frees the shared memory; the sums are in place for
// the next kernel in the stream.
__device__ __forceinline__ void bulk_add_f32(float* global, const float* shared, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto smem = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(global), "r"(smem), "r"(bytes)
      : "memory");
#else
  __trap();  // built only for sm_90 (codegen: Arch.bulk_reduce)
#endif
}

// This thread's bulk adds have read their shared memory, which may be written again.
__device__ __forceinline__ void wait_bulk_reads() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

}  // namespace flashgen
