// Every compile-time choice of the forward kernel, derived from the tile parameters that the
// config gives (codegen/configs/*.toml). The kernel body reads layouts and copy atoms from here.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/mma/tiling.cuh"

namespace flashgen {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kKvStages_, class Element_,
          bool kSeparateMaskedLoop_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKvStages = kKvStages_;
  // The tiles that need a mask run in a loop of their own (codegen/families/mma/resources.py
  // decides).
  static constexpr bool kSeparateMaskedLoop = kSeparateMaskedLoop_;

  static constexpr int kBlockK = row_chunk(kHeadDim);
  static constexpr int kHeadDimPadded = padded_to_chunk(kHeadDim);
  static constexpr bool kHeadDimIsPadded = kHeadDimPadded != kHeadDim;

  static_assert(kHeadDim % 8 == 0, "head_dim must be a multiple of 8 (16-byte loads)");
  static_assert(kKvStages >= 2, "kv_stages must be at least 2");
  static_assert(kBlockM % (16 * kWarps) == 0, "block_m must be a multiple of 16 * warps");
  static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16");

  // Each warp owns block_m / warps consecutive query rows: P stays in registers as the A
  // operand of O += P V, and on the causal diagonal whole warps skip the tiles they cannot see.
  using TiledMma = RowSlabMma<Element, kWarps, kBlockM>;

  using SmemLayoutAtom = SwizzledAtom<kBlockK>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockM>, Int<kHeadDimPadded>>{}));
  // K and V: a ring of kKvStages tiles, (block_n, head_dim, stage).
  using SmemLayoutKV = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDimPadded>, Int<kKvStages>>{}));
  // V read as (head_dim, block_n, stage): the B operand of O += P V, loaded with ldmatrix.trans.
  using SmemLayoutVt = TransposedStagesView<SmemLayoutKV, kBlockN, kHeadDimPadded, kKvStages>;
  // The output is staged in Q's shared memory before the coalesced store.
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kSmemBytes =
      int(sizeof(Element)) * (cosize(SmemLayoutQ{}) + 2 * cosize(SmemLayoutKV{}));

  using SmemCopyAtom = LdsmCopy<Element>;
  using SmemCopyAtomTransposed = LdsmTransposedCopy<Element>;
  using SmemCopyAtomO = AccumulatorStoreCopy<Element>;

  using Gmem = GmemCopies<Element, kThreads, kBlockK>;
  static_assert(kBlockM % Gmem::kRowsPerCopy == 0 && kBlockN % Gmem::kRowsPerCopy == 0,
                "block_m and block_n must be multiples of warps * 32 / (row chunk / 8)");
  using GmemTiledCopyQKV = typename Gmem::Load;
  using GmemTiledCopyO = typename Gmem::Store;
};

}  // namespace flashgen
