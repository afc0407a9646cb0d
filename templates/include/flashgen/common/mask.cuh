// Masks score elements that no query may see: keys past seqlen_k, and with kCausal keys after
// the diagonal. Only the tiles that straddle an edge are masked; the kernel skips the rest.
#pragma once

#include <cmath>
#include <cute/tensor.hpp>

namespace flashgen {

using namespace cute;

// Whether any element of the score tile (m_block, n_block) needs masking.
template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block, int seqlen_k,
                                                int causal_offset) {
  const int last_col = (n_block + 1) * kBlockN - 1;
  const bool past_end = last_col >= seqlen_k;
  const bool past_diagonal = kCausal && last_col > m_block * kBlockM + causal_offset;
  return past_end || past_diagonal;
}

// The largest row (within the tile) of the thread's partition `coords` of an identity tensor.
template <class Coords>
__device__ __forceinline__ int last_row(Coords const& coords) {
  int row = 0;
  CUTE_UNROLL
  for (int i = 0; i < size(coords); ++i) row = max(row, int(get<0>(coords(i))));
  return row;
}

// scores and coords are partitions of the same (block_m, block_n) tile; coords holds each
// element's (row, col) within the tile.
template <bool kCausal, class Scores, class Coords>
__device__ __forceinline__ void apply_mask(Scores& scores, Coords const& coords, int row0,
                                           int col0, int seqlen_k, int causal_offset) {
  CUTE_STATIC_ASSERT_V(size(scores) == size(coords));
  CUTE_UNROLL
  for (int i = 0; i < size(scores); ++i) {
    const int row = row0 + get<0>(coords(i));
    const int col = col0 + get<1>(coords(i));
    if (col >= seqlen_k || (kCausal && col > row + causal_offset)) scores(i) = -INFINITY;
  }
}

}  // namespace flashgen
