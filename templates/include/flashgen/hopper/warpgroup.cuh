// What the Hopper kernels share: shared-memory swizzles for wgmma operands, named barriers and
// one warpgroup's GEMM.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashgen::hopper {

// The widest GMMA swizzle whose atom (8 rows x 8..64 elements) divides a row of `kCols`
// 16-bit elements: 128-byte rows make bank-conflict-free loads for every wgmma operand.
template <class Element, int kCols>
constexpr auto smem_atom() {
  using namespace cute;
  if constexpr (kCols % 64 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
  else if constexpr (kCols % 32 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
  else if constexpr (kCols % 16 == 0) return GMMA::Layout_K_SW32_Atom<Element>{};
  else return GMMA::Layout_K_INTER_Atom<Element>{};
}

// The registers per thread a block of `threads` threads launches with at one block per SM: what
// setmaxnreg redistributes. A warpgroup's setmaxnreg.inc waits until others' .dec have freed
// enough, so the split must fit in it, not in the register file (65536).
constexpr int launch_registers(int threads) { return 65536 / threads / 8 * 8; }

// bar.sync / bar.arrive on named barrier `id` (0 is __syncthreads) among `threads` threads.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// One warpgroup's GEMM: c (+)= a * b over every k-block, issued and committed, not waited for.
template <bool kZeroInit, class TiledMma, class A, class B, class C>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, A const& a, B const& b, C& c) {
  using namespace cute;
  warpgroup_fence_operand(c);
  if constexpr (!std::is_same_v<typename A::engine_type::iterator, GMMA::DescriptorIterator>) {
    warpgroup_fence_operand(const_cast<A&>(a));
  }
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
}

}  // namespace flashgen::hopper
