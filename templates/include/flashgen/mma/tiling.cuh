// What the forward and backward traits share: the MMA atom per element type, the swizzled
// shared-memory atom, how a head dim is cut into row chunks, and the global <-> shared copies.
#pragma once

#include <climits>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashgen {

using namespace cute;

template <class Element> struct Sm80MmaAtom;
template <> struct Sm80MmaAtom<cutlass::half_t> { using type = SM80_16x8x16_F32F16F16F32_TN; };
template <> struct Sm80MmaAtom<cutlass::bfloat16_t> { using type = SM80_16x8x16_F32BF16BF16F32_TN; };

// Shared-memory rows are cut into chunks of 64 elements (128 bytes, one full swizzle period)
// when the width allows it, else 32. A head dim that is not a multiple of the chunk (80, 72) is
// padded up to one; the padding columns are zero-filled and never stored.
constexpr int row_chunk(int cols) { return cols % 64 == 0 ? 64 : 32; }
constexpr int padded_to_chunk(int cols) { return (cols + row_chunk(cols) - 1) / row_chunk(cols) * row_chunk(cols); }

// Swizzled so that both the 16-byte cp.async writes and the ldmatrix reads (plain or
// transposed) are conflict-free.
template <int kChunk>
using SwizzledAtom = decltype(composition(
    Swizzle<kChunk == 64 ? 3 : 2, 3, 3>{},
    Layout<Shape<_8, Int<kChunk>>, Stride<Int<kChunk>, _1>>{}));

// A (rows, cols) layout read as (cols, rows), or (rows, cols, stage) as (cols, rows, stage): the
// operand of an mma that needs the tile transposed, loaded with ldmatrix.trans.
template <class SmemLayout, int kRows, int kCols>
using TransposedView = decltype(composition(
    SmemLayout{}, Layout<Shape<Int<kCols>, Int<kRows>>, Stride<Int<kRows>, _1>>{}));
template <class SmemLayout, int kRows, int kCols, int kStages>
using TransposedStagesView = decltype(composition(
    SmemLayout{}, Layout<Shape<Int<kCols>, Int<kRows>, Int<kStages>>,
                         Stride<Int<kRows>, _1, Int<kRows * kCols>>>{}));

// Warps along M of an (M, N) accumulator split over `warps` warps: the power-of-two split that
// makes each warp's tile closest to square, as that reads the fewest operand bytes from shared
// memory per mma. Of two equally square splits, the one with fewer warps along M, or with
// `more_m_on_tie` the one with more (fewer rows per thread). 0 when no split fits the 16 x 16
// per-warp granule.
constexpr int warps_along_m(int m, int n, int warps, bool more_m_on_tie = false) {
  int best = 0, best_cost = INT_MAX;
  for (int wm = 1; wm <= warps; wm *= 2) {
    const int wn = warps / wm;
    if (m % (16 * wm) != 0 || n % (16 * wn) != 0) continue;
    const int cost = m / wm > n / wn ? m / wm - n / wn : n / wn - m / wm;
    if (cost < best_cost || (more_m_on_tie && cost == best_cost)) best = wm, best_cost = cost;
  }
  return best;
}

// An mma.m16n8k16 tiled over a (kWarpsM x warps / kWarpsM) grid of warps, each 16 x 16 per step
// (16 columns, so that one ldmatrix.x4 feeds B).
template <class Element, int kWarps, int kWarpsM>
using WarpGridMma = TiledMMA<MMA_Atom<typename Sm80MmaAtom<Element>::type>,
                             Layout<Shape<Int<kWarpsM>, Int<kWarps / kWarpsM>, _1>>,
                             Tile<Int<16 * kWarpsM>, Int<16 * (kWarps / kWarpsM)>, _16>>;

// WarpGridMma with each warp's two 8-column atoms per step side by side: a warp owns 16
// consecutive columns of every 16 * (kWarps / kWarpsM), so that a thread holds the (i, j) and
// (i, j + 8) of each pair of atoms that common/dropout.cuh draws from one Philox output.
template <class Element, int kWarps, int kWarpsM>
using PairedColumnsMma = TiledMMA<
    MMA_Atom<typename Sm80MmaAtom<Element>::type>,
    Layout<Shape<Int<kWarpsM>, Int<kWarps / kWarpsM>, _1>>,
    Tile<Int<16 * kWarpsM>,
         Layout<Shape<_8, Int<kWarps / kWarpsM>, _2>, Stride<_1, _16, _8>>, _16>>;

// mma.m16n8k16 over `kWarps` warps stacked along M, each owning kBlockM / kWarps consecutive
// rows of a (kBlockM, 16 * n) accumulator (a permuted tile; WarpGridMma<.., kWarps, kWarps>
// interleaves the warps' 16-row groups instead). Under causal masking whole warps then lie
// before a diagonal tile's first key.
template <class Element, int kWarps, int kBlockM>
using RowSlabMma = TiledMMA<
    MMA_Atom<typename Sm80MmaAtom<Element>::type>, Layout<Shape<Int<kWarps>, _1, _1>>,
    Tile<Layout<Shape<_16, Int<kWarps>, Int<kBlockM / (16 * kWarps)>>,
                Stride<_1, Int<kBlockM / kWarps>, _16>>,
         _16, _16>>;

// Shared -> registers with ldmatrix (plain, or transposed for an operand stored the other way
// round), and registers -> shared for accumulators converted to the input type.
template <class Element> using LdsmCopy = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
template <class Element> using LdsmTransposedCopy = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
template <class Element>
using AccumulatorStoreCopy = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

// Global <-> shared: each thread moves 16 bytes (8 elements) per copy, a row chunk of kChunk
// elements is covered by kChunk / 8 consecutive threads (coalesced).
template <class Element, int kThreads, int kChunk>
struct GmemCopies {
  static constexpr int kThreadsPerRow = kChunk / 8;
  static constexpr int kRowsPerCopy = kThreads / kThreadsPerRow;
  using ThreadLayout = Layout<Shape<Int<kRowsPerCopy>, Int<kThreadsPerRow>>,
                              Stride<Int<kThreadsPerRow>, _1>>;
  using Load = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, ThreadLayout{},
      Layout<Shape<_1, _8>>{}));
  using Store = decltype(make_tiled_copy(
      Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, ThreadLayout{},
      Layout<Shape<_1, _8>>{}));
};

}  // namespace flashgen
