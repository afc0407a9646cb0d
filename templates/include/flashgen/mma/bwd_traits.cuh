// Every compile-time choice of the backward kernels, derived from the config's backward tile:
// block_m query rows per step, block_n keys per thread block, warps, q_stages (Q/dO buffers).
//
// Five GEMMs per (block_m, block_n) tile, each with its own warp grid:
//   S  = Q K^T, dP = dO V^T      (block_m, block_n)    MmaSdP
//   dV += P^T dO, dK += dS^T Q   (block_n, head_dim)   MmadKV
//   dQ  = dS K                   (block_m, head_dim)   MmadQ
// P and dS go through shared memory, where the transposed reads come for free (ldmatrix.trans).
// With kDqBulkReduce (Hopper), each step's dQ also leaves through shared memory, by bulk
// reduce-adds into the fp32 workspace (bulk_reduce.cuh), instead of per-thread atomics.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/mma/tiling.cuh"

namespace flashgen {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kQStages_, class Element_,
          bool kDqBulkReduce_, bool kMaskFreeStep_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQStages = kQStages_;
  static constexpr int kBlockK = row_chunk(kHeadDim);
  static constexpr int kHeadDimPadded = padded_to_chunk(kHeadDim);

  static_assert(kHeadDim % 8 == 0, "head_dim must be a multiple of 8 (16-byte loads)");
  static_assert(kQStages == 1 || kQStages == 2, "q_stages must be 1 or 2");
  static_assert(kBlockN % 32 == 0, "block_n must be a multiple of 32 (P's shared-memory rows)");

  // S and dP: a thread holds the lse and D of each of its rows through the step, so of two
  // equally square splits the one with fewer rows per thread. At hd64's 128 x 128 tile, 32 x 64
  // per warp instead of 64 x 32 took ptxas's spill from 44 bytes to none.
  static constexpr int kWarpsMSdP = warps_along_m(kBlockM, kBlockN, kWarps, true);
  static constexpr int kWarpsNdKV = warps_along_m(kBlockN, kHeadDimPadded, kWarps);
  static constexpr int kWarpsMdQ = warps_along_m(kBlockM, kHeadDimPadded, kWarps);
  static_assert(kWarpsMSdP > 0 && kWarpsNdKV > 0 && kWarpsMdQ > 0,
                "block_m, block_n and head_dim must each split into 16 x 16 tiles per warp");
  using TiledMmaSdP = WarpGridMma<Element, kWarps, kWarpsMSdP>;
  // The same split for a kernel with dropout (common/dropout.cuh's atom pairs in one thread).
  using TiledMmaSdPDropout = PairedColumnsMma<Element, kWarps, kWarpsMSdP>;
  using TiledMmadKV = WarpGridMma<Element, kWarps, kWarpsNdKV>;
  using TiledMmadQ = WarpGridMma<Element, kWarps, kWarpsMdQ>;

  using SmemLayoutAtom = SwizzledAtom<kBlockK>;
  // Q and dO: a ring of q_stages tiles, (block_m, head_dim, stage); read transposed as the B
  // operand of dK += dS^T Q and dV += P^T dO.
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDimPadded>, Int<kQStages>>{}));
  using SmemLayoutQt = TransposedStagesView<SmemLayoutQ, kBlockM, kHeadDimPadded, kQStages>;
  // K and V stay for the whole kernel; K read transposed as the B operand of dQ = dS K. The
  // dK and dV tiles are staged in their place for the coalesced store.
  using SmemLayoutK = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockN>, Int<kHeadDimPadded>>{}));
  using SmemLayoutKt = TransposedView<SmemLayoutK, kBlockN, kHeadDimPadded>;
  // P and dS, (block_m, block_n); read transposed as the A operand of dV and dK.
  using SmemLayoutP = decltype(tile_to_shape(SwizzledAtom<row_chunk(kBlockN)>{},
                                             Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPt = TransposedView<SmemLayoutP, kBlockM, kBlockN>;

  // dQ staging (kDqBulkReduce): a step's (block_m, head_dim) dQ in fp32, each row one bulk add
  // into the workspace. Rows lie 8 floats apart in shared memory, so that an accumulator's
  // 8-byte stores (4 rows x 8 columns per half-warp) hit distinct banks.
  static constexpr bool kDqBulkReduce = kDqBulkReduce_;
  static constexpr int kDqRowStride = kHeadDimPadded + 8;  // floats
  static constexpr int kDqStagingFloats = kDqBulkReduce ? kBlockM * kDqRowStride : 0;
  static_assert(!kDqBulkReduce || kBlockM <= kThreads, "one thread adds each staged row");

  // A split key block's fp32 workspace (BwdParams.dkv_accum): its dK and dV tiles and, after
  // every block's tiles, its counter. flashgen/backward.py sizes it alike.
  static constexpr int kSplitFloats = 2 * kBlockN * kHeadDimPadded + 1;

  // The step in two copies, masked and mask-free (codegen/families/mma/resources.py,
  // has_mask_free_step).
  static constexpr bool kMaskFreeStep = kMaskFreeStep_;

  static constexpr int kSmemBytes =
      int(sizeof(Element)) * (2 * cosize(SmemLayoutQ{}) + 2 * cosize(SmemLayoutK{}) +
                              2 * cosize(SmemLayoutP{})) +
      int(sizeof(float)) * kDqStagingFloats;

  using Gmem = GmemCopies<Element, kThreads, kBlockK>;
  static_assert(kBlockM % Gmem::kRowsPerCopy == 0 && kBlockN % Gmem::kRowsPerCopy == 0,
                "block_m and block_n must be multiples of warps * 32 / (row chunk / 8)");
};

}  // namespace flashgen
