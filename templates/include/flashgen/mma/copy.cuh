// Tile copies between global and shared memory with the ragged edges predicated.
#pragma once

#include <climits>

#include <cute/tensor.hpp>

namespace flashgen {

using namespace cute;

// Copies a (CPY, CPY_ROWS, CPY_COLS) partition chunk by chunk, keeping rows below `max_rows` and
// columns below kMaxCols. With kZeroFill the destination chunks that are cut off are cleared
// instead: garbage left in shared memory could hold NaN bit patterns, and 0 * NaN is NaN.
template <bool kZeroFill, int kMaxCols, class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void copy_tile(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                          Coords const& coords, int max_rows) {
  CUTE_STATIC_ASSERT_V(rank(src) == Int<3>{});
  CUTE_STATIC_ASSERT_V(size<1>(src) == size<1>(dst) && size<2>(src) == size<2>(dst));
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = get<0>(coords(0, m, 0)) < max_rows;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (row_ok && get<1>(coords(0, m, k)) < kMaxCols) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else if constexpr (kZeroFill) {
        clear(dst(_, m, k));
      }
    }
  }
}

// copy_tile for a tile of kTileCols columns whose rows all exist: only columns at or past
// kMaxCols (a head dim padded to the row chunk) are cut off; without padding nothing is
// predicated, which saves the interior tiles' index arithmetic and registers.
template <bool kZeroFill, int kMaxCols, int kTileCols, class TiledCopy, class Src, class Dst,
          class Coords>
__device__ __forceinline__ void copy_all_rows(TiledCopy const& tiled_copy, Src const& src,
                                              Dst&& dst, Coords const& coords) {
  if constexpr (kMaxCols == kTileCols) {
    copy(tiled_copy, src, dst);
  } else {
    copy_tile<kZeroFill, kMaxCols>(tiled_copy, src, dst, coords, INT_MAX);
  }
}

}  // namespace flashgen
