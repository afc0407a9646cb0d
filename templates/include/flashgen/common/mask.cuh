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
  // Whether its key and query block ranges may hold tiles with no visible element, which
  // visits() tells apart (a config-defined variant with skip_blocks); the walks below skip them.
  static constexpr bool kSkipsBlocks = false;
  // Whether what a row sees depends on its query head (a config-defined mask that reads h): then
  // kernels take each head's view by for_head, and block ranges differ per head.
  static constexpr bool kPerHead = false;
  int seqlen_k;

  // For sequence `batch` of the call, of seqlen_k keys, offset its mask_offset.
  __device__ __forceinline__ NoMask(AttentionParams const& /*p*/, int /*batch*/, int seqlen_k,
                                    int /*offset*/)
      : seqlen_k(seqlen_k) {}
  // The policy for query head `head` (itself where kPerHead is false).
  __device__ __forceinline__ NoMask for_head(int /*head*/) const { return *this; }

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
  static constexpr bool kSkipsBlocks = false;
  static constexpr bool kPerHead = false;
  int seqlen_k;
  int offset;

  __device__ __forceinline__ CausalMask(AttentionParams const& /*p*/, int /*batch*/, int seqlen_k,
                                        int offset)
      : seqlen_k(seqlen_k), offset(offset) {}
  __device__ __forceinline__ CausalMask for_head(int /*head*/) const { return *this; }

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
  static constexpr bool kSkipsBlocks = false;
  static constexpr bool kPerHead = false;
  int seqlen_k;
  int offset;
  int left;
  int right;

  __device__ __forceinline__ WindowMask(AttentionParams const& p, int /*batch*/, int seqlen_k,
                                        int offset)
      : seqlen_k(seqlen_k), offset(offset), left(p.window_left), right(p.window_right) {}
  __device__ __forceinline__ WindowMask for_head(int /*head*/) const { return *this; }

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

// The policy a decode kernel runs for a spec's mask: the mask itself, bar a config-defined one
// (common/variant.cuh maps it to a policy that reads no block ranges: decode computes none; and
// likewise its score modifier, common/score_mod.cuh's DecodeScoreMod).
template <class Mask>
struct DecodeMask {
  using type = Mask;
};
// Whether a decode kernel's mask may hide any key of any tile (a built-in mask's visible keys of
// a token are one run that moves right with the token).
template <class Mask>
constexpr bool kMasksEveryTile = false;

// Walks over a mask's block ranges that step over the tiles it has no visible element in (only
// a policy with kSkipsBlocks tells such tiles apart inside its ranges; for the others these are
// the plain ranges and steps). Every family's kernels walk with them.

// Whether tile (m_block, n_block) of a kBlockM x kBlockN tiling holds a visible element.
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ bool visits(Mask const& mask, int m_block, int n_block) {
  if constexpr (Mask::kSkipsBlocks) {
    return mask.template visits<kBlockM, kBlockN>(m_block, n_block);
  } else {
    return true;
  }
}

// The first and last key blocks of [begin, end) that query block m_block visits (first > last:
// none).
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int2 visited_key_blocks(Mask const& mask, int m_block, int begin,
                                                   int end) {
  if constexpr (Mask::kSkipsBlocks) {
    begin = mask.template visited_key_block_from<kBlockM, kBlockN>(m_block, begin, end);
    end = max(begin, mask.template visited_key_block_below<kBlockM, kBlockN>(m_block, end) + 1);
  }
  return make_int2(begin, end - 1);
}

// The visited key block below n_block, or first - 1 when n_block is first (the lowest visited).
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int key_block_below(Mask const& mask, int m_block, int n_block,
                                               int first) {
  if constexpr (Mask::kSkipsBlocks) {
    return max(first - 1,
               mask.template visited_key_block_below<kBlockM, kBlockN>(m_block, n_block));
  } else {
    return n_block - 1;
  }
}

// The query-side walks test 32 query blocks at once, a lane each (a query block's row groups'
// bitmaps lie apart, so one at a time each test waited for its own loads): every lane of the
// warp calls them, with the same arguments.

// The first query block of [from, to) that sees a key of key block n_block, or `to`.
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int first_visited_query_block(Mask const& mask, int n_block, int from,
                                                         int to) {
  const int lane = threadIdx.x % 32;
  for (; from < to; from += 32) {
    const int m_block = from + lane;
    const unsigned seen = __ballot_sync(
        0xffffffffu, m_block < to && visits<kBlockM, kBlockN>(mask, m_block, n_block));
    if (seen) return from + __ffs(seen) - 1;
  }
  return to;
}

// The last query block of [from, to) that sees a key of key block n_block, or from - 1.
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int last_visited_query_block(Mask const& mask, int n_block, int from,
                                                        int to) {
  const int lane = threadIdx.x % 32;
  for (; to > from; to -= 32) {
    const int m_block = to - 1 - lane;
    const unsigned seen = __ballot_sync(
        0xffffffffu, m_block >= from && visits<kBlockM, kBlockN>(mask, m_block, n_block));
    if (seen) return to - __ffs(seen);
  }
  return from - 1;
}

// The first and last query blocks of [begin, end) that see a key of key block n_block.
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int2 visited_query_blocks(Mask const& mask, int n_block, int begin,
                                                     int end) {
  if constexpr (Mask::kSkipsBlocks) {
    begin = first_visited_query_block<kBlockM, kBlockN>(mask, n_block, begin, end);
    return make_int2(begin, last_visited_query_block<kBlockM, kBlockN>(mask, n_block, begin,
                                                                        end));
  } else {
    return make_int2(begin, end - 1);
  }
}

// The visited query block above m_block, or last + 1 when m_block is last (the highest visited).
template <int kBlockM, int kBlockN, class Mask>
__device__ __forceinline__ int query_block_above(Mask const& mask, int n_block, int m_block,
                                                 int last) {
  if constexpr (Mask::kSkipsBlocks) {
    return first_visited_query_block<kBlockM, kBlockN>(mask, n_block, m_block + 1, last + 1);
  } else {
    return m_block + 1;
  }
}

// A step of a backward key block's walk: a query head of its KV head's group, a query block, and
// the last query block the walk visits for that head.
struct BwdStep {
  int head, m_block, last;
};

// A backward key block's walk: each query head of the group in turn, and for each the query
// blocks from the first to the last that see a key of the block, stepping over those in between
// without a visible score where the mask has such (kSkipsBlocks; then whole warps construct and
// step it, as the query-side walks above ask). A mask with kPerHead has each head's own range
// (heads that see nothing of the block are stepped over); the others share one. Where they share
// one without skips, a walk may start `rotation` blocks into it and wrap around (so that the key
// blocks of a head, which a mask without hidden keys sends over the same range, each reach a
// different query block first).
template <int kBlockM, int kBlockN, class Mask>
struct QueryBlockWalk {
  static constexpr bool kRotates = !Mask::kSkipsBlocks && !Mask::kPerHead;
  int n_block, m_blocks;
  int head_first, head_end;  // query heads
  int2 blocks;               // the first and last query block of every head (not kPerHead)
  int rotation;              // each head's first step: blocks.x + rotation (kRotates)
  BwdStep start;

  __device__ __forceinline__ QueryBlockWalk(Mask const& mask, int n_block, int m_blocks,
                                            int head_first, int heads, int rotation = 0)
      : n_block(n_block), m_blocks(m_blocks), head_first(head_first),
        head_end(head_first + heads), blocks(make_int2(0, -1)), rotation(0) {
    if constexpr (!Mask::kPerHead) blocks = visited(mask);
    if constexpr (kRotates) {
      if (blocks.x <= blocks.y) this->rotation = rotation % (blocks.y - blocks.x + 1);
    }
    start = first_step(mask, head_first);
  }
  // The first and last query block that see a key of the block under `mask` (one head's).
  __device__ __forceinline__ int2 visited(Mask const& mask) const {
    const int end = mask.template query_block_end<kBlockM, kBlockN>(n_block, m_blocks);
    const int begin = min(end, mask.template query_block_begin<kBlockM, kBlockN>(n_block));
    return visited_query_blocks<kBlockM, kBlockN>(mask, n_block, begin, end);
  }
  // The walk's first step at head `head` or after it (done() where none has one).
  __device__ __forceinline__ BwdStep first_step(Mask const& mask, int head) const {
    for (; head < head_end; ++head) {
      int2 range = blocks;
      if constexpr (Mask::kPerHead) range = visited(mask.for_head(head));
      if (range.x <= range.y) return {head, range.x + rotation, range.y};
      if constexpr (!Mask::kPerHead) break;  // every head alike: none has a step
    }
    return {head_end, 0, -1};
  }
  __device__ __forceinline__ bool has_steps() const { return !done(start); }
  // The number of steps, exact where every head shares a range without skips (else an upper
  // bound).
  __device__ __forceinline__ int steps_at_most() const {
    if constexpr (Mask::kPerHead) {
      return has_steps() ? (head_end - start.head) * m_blocks : 0;
    } else {
      return has_steps() ? (head_end - head_first) * (blocks.y - blocks.x + 1) : 0;
    }
  }
  __device__ __forceinline__ bool done(BwdStep at) const { return at.head >= head_end; }
  __device__ __forceinline__ BwdStep next(Mask const& mask, BwdStep at) const {
    if constexpr (kRotates) {
      const int m_block = at.m_block == at.last ? blocks.x : at.m_block + 1;
      return m_block == blocks.x + rotation ? first_step(mask, at.head + 1)
                                            : BwdStep{at.head, m_block, at.last};
    }
    const int m_block = query_block_above<kBlockM, kBlockN>(mask.for_head(at.head), n_block,
                                                            at.m_block, at.last);
    return m_block > at.last ? first_step(mask, at.head + 1)
                             : BwdStep{at.head, m_block, at.last};
  }
  // Step `step` of the walk: closed-form where every head shares a range without skips, else
  // walked to.
  __device__ __forceinline__ BwdStep at_step(Mask const& mask, int step) const {
    if constexpr (kRotates) {
      if (!has_steps()) return start;
      const int count = blocks.y - blocks.x + 1;
      return {head_first + step / count, blocks.x + (step % count + rotation) % count, blocks.y};
    } else {
      BwdStep at = start;
      for (; step > 0 && !done(at); --step) at = next(mask, at);
      return at;
    }
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

// apply_mask for a kBlockN-key tile whose partition's rows all lie in one group of 16 (a wgmma
// accumulator's thread holds rows r and r + 8 of a 16-row slab). Where a mask with kSkipsBlocks
// finds each 16 x 16 group of the thread's row group wholly seen or unseen (a block-sparse
// layout's), its bitmaps decide every element; elsewhere its predicate runs on each (testing the
// bitmaps per element first slowed a document mask's diagonal tiles).
template <int kBlockN, class Mask, class Scores, class Coords>
__device__ __forceinline__ void apply_mask_one_row_group(Mask const& mask, Scores& scores,
                                                         Coords const& coords, int row0,
                                                         int col0) {
  if constexpr (Mask::kSkipsBlocks) {
    const auto groups = mask.template tile_row_group<kBlockN>(row0 + cute::get<0>(coords(0)),
                                                             col0);
    if (groups.whole_or_unseen) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(scores); ++i) {
        const int row = row0 + cute::get<0>(coords(i));
        const int col = col0 + cute::get<1>(coords(i));
        if (!mask.visible_by_groups(groups, row, col)) scores(i) = -INFINITY;
      }
      return;
    }
  }
  apply_mask(mask, scores, coords, row0, col0);
}

}  // namespace flashgen
