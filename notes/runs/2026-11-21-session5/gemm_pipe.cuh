// Warp-level GEMM steps of the attention tile: shared memory -> registers with ldmatrix, a few
// B-operand chunks ahead of the mma.m16n8k16 instructions that consume them.
#pragma once

#include <cute/tensor.hpp>

namespace flashgen {

using namespace cute;

// The register fragment `frag` viewed as the destination of the shared -> register copy.
template <class TiledCopy, class Fragment>
__device__ __forceinline__ auto retile_for(TiledCopy const&, Fragment& frag) {
  return make_tensor(frag.data(), TiledCopy::retile(frag.layout()));
}

// How far ahead of the MMAs the B operand is loaded, in ldmatrix chunks. A whole k-slice ahead
// (as CUTLASS's examples do) keeps two slices of B live: at head dim 128 that is 64 registers
// of V beside 192 of accumulators.
constexpr int kPrefetchChunks = 2;

// acc += A * B over k, in items (k-slice, B chunk): item i's MMAs run after the copy of item
// i + kPrefetchChunks is issued; A's k-slice is loaded with its first chunk. Each ldmatrix
// chunk of B feeds kPerChunk consecutive MMA columns (checked at compile time).
template <bool kLoadA, class TiledMma, class Acc, class RegA, class RegB, class SmemA,
          class SmemB, class CopyA, class CopyB>
__device__ __forceinline__ void gemm_pipelined(TiledMma const& tiled_mma, Acc& acc, RegA& tCrA,
                                               RegB& tCrB, SmemA const& tCsA, SmemB const& tCsB,
                                               CopyA const& copy_a, CopyB const& copy_b) {
  auto tCrB_view = retile_for(copy_b, tCrB);
  constexpr int kChunks = decltype(size<1>(tCrB_view))::value;
  constexpr int kSlices = decltype(size<2>(tCrB))::value;
  constexpr int kPerChunk = decltype(size<1>(tCrB))::value / kChunks;
  constexpr int kItems = kSlices * kChunks;
  static_assert(kPerChunk * kChunks == decltype(size<1>(tCrB))::value);
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));  // chunks of B
  CUTE_STATIC_ASSERT_V(size<2>(tCrA) == size<2>(tCrB));       // MMA_K
  // Chunk c of the copy view holds MMA columns c * kPerChunk ...: the same registers.
  static_assert(decltype(tCrB_view.layout()(_0{}, Int<kChunks - 1>{}, _0{}))::value ==
                decltype(tCrB.layout()(_0{}, Int<(kChunks - 1) * kPerChunk>{}, _0{}))::value);

  auto load = [&](auto item) {
    constexpr int k = decltype(item)::value / kChunks;
    constexpr int c = decltype(item)::value % kChunks;
    if constexpr (kLoadA && c == 0) {
      auto tCrA_view = retile_for(copy_a, tCrA);
      copy(copy_a, tCsA(_, _, k), tCrA_view(_, _, k));
    }
    copy(copy_b, tCsB(_, c, k), tCrB_view(_, c, k));
  };
  for_each(make_int_sequence<(kPrefetchChunks < kItems ? kPrefetchChunks : kItems)>{}, load);
  for_each(make_int_sequence<kItems>{}, [&](auto item) {
    constexpr int i = decltype(item)::value;
    if constexpr (i + kPrefetchChunks < kItems) load(Int<i + kPrefetchChunks>{});
    constexpr int k = i / kChunks;
    constexpr int c = i % kChunks;
    CUTE_UNROLL
    for (int n = c * kPerChunk; n < (c + 1) * kPerChunk; ++n) {
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tCrA); ++m) {
        gemm(tiled_mma, acc(_, m, n), tCrA(_, m, k), tCrB(_, n, k), acc(_, m, n));
      }
    }
  });
}

// acc += A * B with both operands in shared memory (S = Q K^T).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB,
          class CopyA, class CopyB>
__device__ __forceinline__ void gemm_ss(TiledMma const& tiled_mma, Acc& acc, RegA& tCrA,
                                        RegB& tCrB, SmemA const& tCsA, SmemB const& tCsB,
                                        CopyA const& copy_a, CopyB const& copy_b) {
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(retile_for(copy_a, tCrA)));  // MMA_M
  gemm_pipelined<true>(tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, copy_a, copy_b);
}

// acc += A * B with A already in registers (O += P V: P never leaves the registers).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemB, class CopyB>
__device__ __forceinline__ void gemm_rs(TiledMma const& tiled_mma, Acc& acc, RegA const& tCrA,
                                        RegB& tCrB, SmemB const& tCsB, CopyB const& copy_b) {
  gemm_pipelined<false>(tiled_mma, acc, tCrA, tCrB, tCsB, tCsB, copy_b, copy_b);
}

}  // namespace flashgen
