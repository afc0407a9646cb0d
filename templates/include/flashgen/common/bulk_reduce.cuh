// Hopper's bulk reduce-add into fp32 global memory, for the backwards' dQ workspace: a contiguous
// span of fp32 in shared memory added by one instruction of the TMA engine (no tensor map),
// asynchronously. Both backwards stage each step's dQ share in shared memory and add it this way:
// atomics or vector reductions from registers hold the issuing threads until the load/store
// unit has taken them all. Where the adds' bytes themselves limit the kernel (the hopper
// backward split by the head dim), 16-byte reductions from registers ran faster. A span's first
// contribution may be a plain bulk copy instead, so that the span needs no zeroing first.
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

// global[0, bytes) = shared[0, bytes), fp32: bulk_add_f32's plain copy.
__device__ __forceinline__ void bulk_store_f32(float* global, const float* shared, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto smem = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(global), "r"(smem), "r"(bytes)
      : "memory");
#else
  __trap();  // built only for sm_90
#endif
}

// global[0, 4) += (x, y, z, w), fp32, global 16-byte aligned: one vector reduction in L2.
__device__ __forceinline__ void reduce_add_f32x4(float* global, float x, float y, float z,
                                                 float w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(global), "f"(x), "f"(y),
               "f"(z), "f"(w)
               : "memory");
#else
  __trap();  // built only for sm_90
#endif
}

// This thread's bulk adds are in global memory (their sums visible to this thread).
__device__ __forceinline__ void wait_bulk_writes() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// This thread's bulk adds have read their shared memory, which may be written again.
__device__ __forceinline__ void wait_bulk_reads() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

}  // namespace flashgen
