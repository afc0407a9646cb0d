// Mask policies: which keys of its sequence a query row sees. Every policy hides the keys past
// seqlen_k (tiles are padded up to whole blocks); each answers, for one sequence, which key blocks
// a query block visits, which query blocks a key block sees, whether a tile needs masking at all
// (only tiles that straddle an edge are masked; kernels skip the rest) and the masking itself.
// Forward and backward kernels of every family take one as a template parameter; codegen/masks.py
// names them. A config-defined mask (common/variant.cuh's VariantMask) is a further policy with
// these members.
#pragma once

#include <cmath>
#include <cute/tensor.hpp>

#include "flashgen/common/params.h"

namespace flashgen {

// Every key of the sequence.
struct NoMask {
  // Whether the policy hides keys inside the sequence (then a tile's rows may see different keys).
  static constexpr bool kHidesKeys = false;
  int seqlen_k;

  // For sequence `batch` of the call, of seqlen_k keys, offset its mask_offset.
  __device__ __forceinline__ NoMask(AttentionParams const& /*p*/, int /*batch*/, int seqlen_k,
                                    int /*offset*/)
      : seqlen_k(seqlen_k) {}

  // The first key block that a query block whose first row is first_row visits.
  template <int kBlockN>
  __device__ __forceinline__ int key_block_begin(int /*first_row*/) const {
    return 0;
  }
  // One past the last key block that a query block whose last row is last_row visits.
  template <int kBlockN>
  __device__ __forceinline__ int key_block_end(int /*last_row*/) const {
    return (seqlen_k + kBlockN - 1) / kBlockN;
  }
  // The first query block that sees a key of key block n_block.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_begin(int /*n_block*/) const {
    return 0;
  }
  // One past the last query block (of m_blocks) that sees a key of key block n_block.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_end(int /*n_block*/, int m_blocks) const {
    return m_blocks;
  }
  // Whether row sees any key from col on (a warp whose rows see none skips the tile).
  __device__ __forceinline__ bool sees_from(int /*row*/, int /*col*/) const { return true; }
  // Whether any element of the score tile (m_block, n_block) is hidden.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int /*m_block*/, int n_block) const {
    return (n_block + 1) * kBlockN - 1 >= seqlen_k;
  }
  __device__ __forceinline__ bool visible(int /*row*/, int col) const { return col < seqlen_k; }
};

// Query row i sees key j iff j <= i + offset (offset: per sequence, see params.h's mask_offset).
struct CausalMask {
  static constexpr bool kHidesKeys = true;
  int seqlen_k;
  int offset;

  __device__ __forceinline__ CausalMask(AttentionParams const& /*p*/, int /*batch*/, int seqlen_k,
                                        int offset)
      : seqlen_k(seqlen_k), offset(offset) {}

  template <int kBlockN>
  __device__ __forceinline__ int key_block_begin(int /*first_row*/) const {
    return 0;
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_end(int last_row) const {
    const int last_visible_col = last_row + offset;
    const int blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    return last_visible_col < 0 ? 0 : min(blocks, last_visible_col / kBlockN + 1);
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_begin(int n_block) const {
    return max(0, n_block * kBlockN - offset) / kBlockM;
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_end(int /*n_block*/, int m_blocks) const {
    return m_blocks;
  }
  __device__ __forceinline__ bool sees_from(int row, int col) const { return col <= row + offset; }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block) const {
    const int last_col = (n_block + 1) * kBlockN - 1;
    return last_col >= seqlen_k || last_col > m_block * kBlockM + offset;
  }
  __device__ __forceinline__ bool visible(int row, int col) const {
    return col < seqlen_k && col <= row + offset;
  }
};

// The window kind's policy: query row i sees key j iff i + offset - left <= j <= i + offset + right
// (left and right: params.h's window_left and window_right, at run time; either may be
// unbounded). The key blocks wholly outside the band are never visited, so time grows with the
// window, not the sequence. A policy of its own, so that causal kernels carry no second bound
// (it measurably slows them). Bounds are at most 2^30 (params.h), so no sum overflows.
struct WindowMask {
  static constexpr bool kHidesKeys = true;
  int seqlen_k;
  int offset;
  int left;
  int right;

  __device__ __forceinline__ WindowMask(AttentionParams const& p, int /*batch*/, int seqlen_k,
                                        int offset)
      : seqlen_k(seqlen_k), offset(offset), left(p.window_left), right(p.window_right) {}

  template <int kBlockN>
  __device__ __forceinline__ int key_block_begin(int first_row) const {
    return max(0, first_row + offset - left) / kBlockN;
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_end(int last_row) const {
    const int last_visible_col = last_row + offset + right;
    const int blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    return last_visible_col < 0 ? 0 : min(blocks, last_visible_col / kBlockN + 1);
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_begin(int n_block) const {
    return max(0, n_block * kBlockN - offset - right) / kBlockM;
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_end(int n_block, int m_blocks) const {
    const int last_row = (n_block + 1) * kBlockN - 1 - offset + left;
    return last_row < 0 ? 0 : min(m_blocks, last_row / kBlockM + 1);
  }
  __device__ __forceinline__ bool sees_from(int row, int col) const {
    return col <= row + offset + right;
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block) const {
    const int first_col = n_block * kBlockN;
    const int last_col = first_col + kBlockN - 1;
    return last_col >= seqlen_k || last_col > m_block * kBlockM + offset + right ||
           first_col < (m_block + 1) * kBlockM - 1 + offset - left;
  }
  __device__ __forceinline__ bool visible(int row, int col) const {
    return col < seqlen_k && col <= row + offset + right && col >= row + offset - left;
  }
};

// The largest row (within the tile) of the thread's partition `coords` of an identity tensor.
template <class Coords>
__device__ __forceinline__ int last_row(Coords const& coords) {
  int row = 0;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(coords); ++i) row = max(row, int(cute::get<0>(coords(i))));
  return row;
}

// Sets the hidden scores to -inf. scores and coords are partitions of the same tile; coords holds
// each element's (row, col) within the tile, whose first element is (row0, col0).
template <class Mask, class Scores, class Coords>
__device__ __forceinline__ void apply_mask(Mask const& mask, Scores& scores, Coords const& coords,
                                           int row0, int col0) {
  CUTE_STATIC_ASSERT_V(cute::size(scores) == cute::size(coords));
  CUTE_UNROLL
  for (int i = 0; i < cute::size(scores); ++i) {
    const int row = row0 + cute::get<0>(coords(i));
    const int col = col0 + cute::get<1>(coords(i));
    if (!mask.visible(row, col)) scores(i) = -INFINITY;
  }
}

}  // namespace flashgen
