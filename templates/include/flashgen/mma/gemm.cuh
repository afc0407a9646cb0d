// Warp-level GEMM steps of the attention tile: shared memory -> registers with ldmatrix,
// one k-slice ahead of the mma.m16n8k16 that consumes it.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/mma/accumulator.cuh"

namespace flashgen {

using namespace cute;

// The register fragment `frag` viewed as the destination of the shared -> register copy.
template <class TiledCopy, class Fragment>
__device__ __forceinline__ auto retile_for(TiledCopy const&, Fragment& frag) {
  return make_tensor(frag.data(), TiledCopy::retile(frag.layout()));
}

// acc += A * B with both operands in shared memory (S = Q K^T).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB,
          class CopyA, class CopyB>
__device__ __forceinline__ void gemm_ss(TiledMma const& tiled_mma, Acc& acc, RegA& tCrA,
                                        RegB& tCrB, SmemA const& tCsA, SmemB const& tCsB,
                                        CopyA const& copy_a, CopyB const& copy_b) {
  auto tCrA_view = retile_for(copy_a, tCrA);
  auto tCrB_view = retile_for(copy_b, tCrB);
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(tCrA_view));  // MMA_M
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));  // MMA_N
  CUTE_STATIC_ASSERT_V(size<2>(tCrA) == size<2>(tCrB));       // MMA_K
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (O += P V: P never leaves the registers).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemB, class CopyB>
__device__ __forceinline__ void gemm_rs(TiledMma const& tiled_mma, Acc& acc, RegA const& tCrA,
                                        RegB& tCrB, SmemB const& tCsB, CopyB const& copy_b) {
  auto tCrB_view = retile_for(copy_b, tCrB);
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));  // MMA_N
  CUTE_STATIC_ASSERT_V(size<2>(tCrA) == size<2>(tCrB));       // MMA_K
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) {
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// O += P V: P, the softmax's probabilities in the S accumulator, converted to the input type and
// kept in registers as the A operand.
template <class Element, class TiledMma, class AccO, class AccS, class RegB, class SmemB,
          class CopyB>
__device__ __forceinline__ void gemm_pv(TiledMma const& tiled_mma, AccO& acc_o, AccS const& acc_s,
                                        RegB& tOrVt, SmemB const& tOsVt, CopyB const& copy_v) {
  Tensor p_regs = make_tensor_like<Element>(acc_s);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) p_regs(i) = Element(acc_s(i));
  Tensor tOrP = make_tensor(p_regs.data(), acc_as_a_layout(p_regs.layout()));
  gemm_rs(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, copy_v);
}

}  // namespace flashgen
