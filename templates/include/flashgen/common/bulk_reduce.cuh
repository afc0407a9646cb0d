// Hopper's reductions into fp32 global memory, for the backwards' dQ workspace:
// - the bulk reduce-add (the TMA engine, no tensor map): a contiguous span of fp32 in shared
//   memory added by one instruction, asynchronously. The mma backward stages each step's dQ rows
//   and adds them this way (its threads hold column pairs: 8-byte atomics queued on the
//   load/store unit cost more than the staging);
// - the 16-byte vector reduction, which the hopper backward issues straight from registers: its
//   workspace is in register order, so a warp's adds are 512 contiguous bytes.
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

// global[0, 4) += (a, b, c, d), fp32, by one 16-byte reduction in L2 (global 16-byte aligned). No
// result comes back, so the thread goes on at once.
__device__ __forceinline__ void add_f32x4(float* global, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(global), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
#else
  __trap();  // vector reductions need sm_90
#endif
}

}  // namespace flashgen
