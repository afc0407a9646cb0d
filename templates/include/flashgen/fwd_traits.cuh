// Every compile-time choice of the forward kernel, derived from the tile parameters that the
// config gives (codegen/configs/*.toml). The kernel body reads layouts and copy atoms from here.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashgen {

using namespace cute;

template <class Element> struct Sm80MmaAtom;
template <> struct Sm80MmaAtom<cutlass::half_t> { using type = SM80_16x8x16_F32F16F16F32_TN; };
template <> struct Sm80MmaAtom<cutlass::bfloat16_t> { using type = SM80_16x8x16_F32BF16BF16F32_TN; };

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kKvStages_, class Element_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKvStages = kKvStages_;

  // Shared-memory rows are cut into chunks of 64 elements (128 bytes, one full swizzle period)
  // when the head dim allows it, else 32. A head dim that is not a multiple of the chunk (80, 72)
  // is padded up to one; the padding columns are zero-filled and never stored.
  static constexpr int kBlockK = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kHeadDimPadded = (kHeadDim + kBlockK - 1) / kBlockK * kBlockK;
  static constexpr bool kHeadDimIsPadded = kHeadDimPadded != kHeadDim;

  static_assert(kHeadDim % 8 == 0, "head_dim must be a multiple of 8 (16-byte loads)");
  static_assert(kKvStages >= 2, "kv_stages must be at least 2");
  static_assert(kBlockM % (16 * kWarps) == 0, "block_m must be a multiple of 16 * warps");
  static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16");

  // One warp per 16 query rows; N and K of the tile are 16 so that one ldmatrix.x4 feeds B.
  using TiledMma = TiledMMA<MMA_Atom<typename Sm80MmaAtom<Element>::type>,
                            Layout<Shape<Int<kWarps>, _1, _1>>,
                            Tile<Int<16 * kWarps>, _16, _16>>;

  // Swizzled so that both the 16-byte cp.async writes and the ldmatrix reads are conflict-free.
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kBlockK == 64 ? 3 : 2, 3, 3>{},
      Layout<Shape<_8, Int<kBlockK>>, Stride<Int<kBlockK>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockM>, Int<kHeadDimPadded>>{}));
  // K and V: a ring of kKvStages tiles, (block_n, head_dim, stage).
  using SmemLayoutKV = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDimPadded>, Int<kKvStages>>{}));
  // V read as (head_dim, block_n, stage): the B operand of O += P V, loaded with ldmatrix.trans.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      Layout<Shape<Int<kHeadDimPadded>, Int<kBlockN>, Int<kKvStages>>,
             Stride<Int<kBlockN>, _1, Int<kBlockN * kHeadDimPadded>>>{}));
  // The output is staged in Q's shared memory before the coalesced store.
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kSmemBytes =
      int(sizeof(Element)) * (cosize(SmemLayoutQ{}) + 2 * cosize(SmemLayoutKV{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  // Global <-> shared: each thread moves 16 bytes (8 elements) per copy, a row of kBlockK
  // elements is covered by kBlockK / 8 consecutive threads (coalesced).
  static constexpr int kThreadsPerRow = kBlockK / 8;
  static constexpr int kRowsPerCopy = kThreads / kThreadsPerRow;
  static_assert(kBlockM % kRowsPerCopy == 0 && kBlockN % kRowsPerCopy == 0,
                "block_m and block_n must be multiples of warps * 32 / (row chunk / 8)");
  using GmemThreadLayout = Layout<Shape<Int<kRowsPerCopy>, Int<kThreadsPerRow>>,
                                  Stride<Int<kThreadsPerRow>, _1>>;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      Layout<Shape<_1, _8>>{}));
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, GmemThreadLayout{},
      Layout<Shape<_1, _8>>{}));
};

}  // namespace flashgen
