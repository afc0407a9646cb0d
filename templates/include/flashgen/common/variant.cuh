// Config-defined variants (codegen/variants.py): the config's C++ renders into a struct V with
// mask_mod(b, h, q_idx, kv_idx) and/or score_mod(score, b, h, q_idx, kv_idx) and
// score_mod_grad(...); VariantMask<V> and VariantScore<V> make it a mask policy (common/mask.cuh)
// and a score modifier (common/score_mod.cuh) that every kernel of both families takes.
//
// A predicate says nothing about which key blocks a query block may skip, so a call first runs
// compute_mask_ranges (once per batch of inputs: flashgen.block_mask keeps the result): per
// sequence (and query head, for a mask_mod that reads h: V::kPerHead) and group of 16 query
// rows, the range of keys it sees and two bitmaps over its groups of 16 keys: those it sees any
// key of, and those it sees whole. A variant with skip_blocks visits the tiles inside the range
// with a bit of the first set (a block-sparse mask's unlisted blocks are never loaded) and masks
// those not wholly in the second (its listed blocks run unmasked); groups of 16 divide every
// tile, so one block mask serves every family's tiles. One without visits the whole range and
// masks the tiles outside the keys every row of the query block sees (a run, for masks whose
// rows see one), which costs no bitmap reads per tile.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "flashgen/common/launch.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/variant_tensor.cuh"

namespace flashgen {

// Rows (and keys) per group of the block mask: every tile's block_m and block_n is a multiple.
constexpr int kMaskRangeRows = 16;

__host__ __device__ __forceinline__ int mask_range_groups(AttentionParams const& p) {
  return (p.seqlen_q + kMaskRangeRows - 1) / kMaskRangeRows;
}

// Each bitmap's 32-bit words: one bit per group of 16 keys (bit g % 32 of word g / 32), a spare
// word so that any tile's run of bits lies in two adjacent words, rounded to 16 bytes
// (flashgen/variants.py's mask_block_words).
__host__ __device__ __forceinline__ int mask_block_words(AttentionParams const& p) {
  const int key_groups = (p.seqlen_k + kMaskRangeRows - 1) / kMaskRangeRows;
  return ((key_groups + 31) / 32 + 1 + 3) / 4 * 4;
}

// The ints per group of query rows in params.mask_ranges: its MaskRange, the bitmap of key
// groups it sees any key of, the bitmap of those it sees whole.
constexpr int kMaskRangeInts = 4;
__host__ __device__ __forceinline__ int mask_row_ints(AttentionParams const& p) {
  return kMaskRangeInts + 2 * mask_block_words(p);
}

// The block masks per sequence: one per query head where the mask_mod reads h, else one.
template <class V>
__host__ __device__ __forceinline__ int mask_heads(AttentionParams const& p) {
  return V::kPerHead ? p.heads : 1;
}

// The keys one group of 16 query rows sees lie in [first, end), made monotone (first a minimum
// over this and later groups, end a maximum over this and earlier ones) so that every family's
// block ranges agree, forward and backward (the hopper backward's deterministic dQ order counts
// on it). Every row sees the keys all_first..all_last (rows that see an unbroken run).
struct alignas(16) MaskRange {
  int first, end;
  int all_first, all_last;
};
static_assert(sizeof(MaskRange) == kMaskRangeInts * sizeof(int));

// The mask policy of a variant with a mask_mod: params.mask_ranges holds the MaskRanges and
// bitmaps. Within a masked tile the mask_mod runs on every element, except where
// apply_mask_one_row_group lets the bitmaps decide (skip_blocks).
template <class V>
struct VariantMask {
  static constexpr bool kHidesKeys = true;
  static constexpr bool kSkipsBlocks = V::kSkipBlocks;
  static constexpr bool kPerHead = V::kPerHead;
  V variant;
  int batch;
  int head = 0;  // the query head the mask_mod sees (for_head sets it where kPerHead)
  int seqlen_q;
  int seqlen_k;
  int groups;
  int row_ints;        // mask_row_ints
  int words;           // mask_block_words
  const int* entries;  // this sequence's (and head's), one per group of query rows
  mutable int all_see_block = -1;  // tile_needs_mask's query block, and the keys all its rows see
  mutable int all_see_first = 0;
  mutable int all_see_last = 0;

  __device__ __forceinline__ VariantMask(AttentionParams const& p, int batch, int seqlen_k,
                                         int /*offset*/)
      : variant(p), batch(batch),
        seqlen_q(p.cu_seqlens_q == nullptr ? p.seqlen_q
                                           : p.cu_seqlens_q[batch + 1] - p.cu_seqlens_q[batch]),
        seqlen_k(seqlen_k), groups(mask_range_groups(p)), row_ints(mask_row_ints(p)),
        words(mask_block_words(p)),
        entries(p.mask_ranges + int64_t(batch) * mask_heads<V>(p) * groups * row_ints) {}

  __device__ __forceinline__ VariantMask for_head(int h) const {
    VariantMask view = *this;
    if constexpr (kPerHead) {
      view.head = h;
      view.entries = entries + (int64_t(h) - head) * groups * row_ints;
      view.all_see_block = -1;
    }
    return view;
  }

  __device__ __forceinline__ int group_of(int row) const {
    return min(groups - 1, row / kMaskRangeRows);
  }
  __device__ __forceinline__ MaskRange range(int group) const {
    return *reinterpret_cast<const MaskRange*>(entries + group * row_ints);
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_blocks() const {
    return (seqlen_k + kBlockN - 1) / kBlockN;
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_begin(int first_row) const {
    return min(key_blocks<kBlockN>(), range(group_of(first_row)).first / kBlockN);
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_end(int last_row) const {
    return min(key_blocks<kBlockN>(), (range(group_of(last_row)).end + kBlockN - 1) / kBlockN);
  }
  // The query blocks m with key_block_begin(m's first row) <= n_block < key_block_end(m's last
  // row, padded): both bounds grow with m, so they are a run, found by bisection.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_begin(int n_block) const {
    const int m_blocks = (groups * kMaskRangeRows + kBlockM - 1) / kBlockM;
    int low = 0, high = m_blocks;  // the first m whose end passes n_block
    while (low < high) {
      const int m = (low + high) / 2;
      if (key_block_end<kBlockN>((m + 1) * kBlockM - 1) > n_block) high = m; else low = m + 1;
    }
    return low;
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int query_block_end(int n_block, int m_blocks) const {
    int low = 0, high = m_blocks;  // the first m whose begin passes n_block
    while (low < high) {
      const int m = (low + high) / 2;
      if (key_block_begin<kBlockN>(m * kBlockM) > n_block) high = m; else low = m + 1;
    }
    return low;
  }
  __device__ __forceinline__ bool sees_from(int /*row*/, int /*col*/) const { return true; }

  // Word `word` of bitmap `bitmap` (0: seen, 1: wholly seen) of each row group of query block
  // m_block, ORed (kAll false) or ANDed (kAll true); four row groups' loads go out together.
  template <int kBlockM, bool kAll>
  __device__ __forceinline__ uint64_t row_groups_bits(int m_block, int word, int bitmap,
                                                     bool two_words) const {
    static_assert(kBlockM % kMaskRangeRows == 0, "tiles are whole groups of 16 rows");
    constexpr int kRowGroups = kBlockM / kMaskRangeRows;
    const int first_group = m_block * kRowGroups;
    const int* bits = entries + first_group * row_ints + kMaskRangeInts + bitmap * words + word;
    uint64_t result = kAll ? ~uint64_t(0) : 0;
#pragma unroll 4  // fully unrolled, 12 row groups' loads (block_m 192) spilled at head dim 64
    for (int g = 0; g < kRowGroups; ++g) {
      if (first_group + g < groups) {
        const int* at = bits + g * row_ints;
        const uint64_t run = uint32_t(__ldg(at)) |
                             (two_words ? uint64_t(uint32_t(__ldg(at + 1))) << 32 : 0);
        result = kAll ? result & run : result | run;
      }
    }
    return result;
  }
  // The mask of key block n_block's key groups within the 64 bits from word n_block's first key
  // group lies in.
  template <int kBlockN>
  __device__ __forceinline__ static uint64_t key_block_span(int n_block) {
    static_assert(kBlockN % kMaskRangeRows == 0 && kBlockN / kMaskRangeRows <= 32,
                  "tiles are whole groups of 16 keys, at most 512");
    constexpr int kKeyGroups = kBlockN / kMaskRangeRows;
    return ((uint64_t(1) << kKeyGroups) - 1) << (n_block * kKeyGroups % 32);
  }
  // Whether a row of query block m_block sees a key of key block n_block.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool visits(int m_block, int n_block) const {
    const int word = n_block * (kBlockN / kMaskRangeRows) / 32;
    return (row_groups_bits<kBlockM, false>(m_block, word, 0, true) &
            key_block_span<kBlockN>(n_block)) != 0;
  }
  // The highest key block below n_block that query block m_block visits, or -1: a word (32 key
  // groups) of the rows' ORed bitmap at a time.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int visited_key_block_below(int m_block, int n_block) const {
    constexpr int kKeyGroups = kBlockN / kMaskRangeRows;
    for (int end = n_block * kKeyGroups; end > 0;) {  // the key groups below `end`
      const int word = (end - 1) / 32;
      const int below = end - word * 32;  // this word's bits below `end`
      const uint32_t seen = uint32_t(row_groups_bits<kBlockM, false>(m_block, word, 0, false)) &
                            (below >= 32 ? ~0u : (1u << below) - 1);
      if (seen) return (word * 32 + 31 - __clz(seen)) / kKeyGroups;
      end = word * 32;
    }
    return -1;
  }
  // The lowest key block from n_block on that query block m_block visits, or `blocks` if none
  // below `blocks` does.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ int visited_key_block_from(int m_block, int n_block,
                                                        int blocks) const {
    constexpr int kKeyGroups = kBlockN / kMaskRangeRows;
    const int end = blocks * kKeyGroups;
    for (int from = n_block * kKeyGroups; from < end;) {  // the key groups from `from` on
      const int word = from / 32;
      const uint32_t seen = uint32_t(row_groups_bits<kBlockM, false>(m_block, word, 0, false)) &
                            (~0u << (from % 32));
      if (seen) return min(blocks, (word * 32 + __ffs(seen) - 1) / kKeyGroups);
      from = (word + 1) * 32;
    }
    return blocks;
  }
  // Whether some row of the tile does not see some key of it (or the tile passes seqlen_k): from
  // the wholly-seen bitmap with skip_blocks, else from the run of keys every row sees, kept for
  // the query block asked about last (kernels ask about one query block's tiles in turn).
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block) const {
    if ((n_block + 1) * kBlockN > seqlen_k) return true;
    if constexpr (kSkipsBlocks) {
      const int word = n_block * (kBlockN / kMaskRangeRows) / 32;
      const uint64_t span = key_block_span<kBlockN>(n_block);
      return (row_groups_bits<kBlockM, true>(m_block, word, 1, true) & span) != span;
    } else {
      if (m_block != all_see_block) {
        all_see_block = m_block;
        all_see_first = 0;
        all_see_last = INT_MAX;
        const int first_group = m_block * (kBlockM / kMaskRangeRows);
        const int end_group = min(groups, first_group + kBlockM / kMaskRangeRows);
        for (int g = first_group; g < end_group; ++g) {
          const MaskRange r = range(g);
          all_see_first = max(all_see_first, r.all_first);
          all_see_last = min(all_see_last, r.all_last);
        }
      }
      return n_block * kBlockN < all_see_first || (n_block + 1) * kBlockN - 1 > all_see_last;
    }
  }
  // Rows past the sequence (a tile's padding) see nothing, and the mask_mod never sees them: it
  // runs on the nearest position inside, its answer dropped, so no branch splits the tile's
  // elements (the compiler then loads the snippet's reads for all of them together).
  __device__ __forceinline__ bool visible(int row, int col) const {
    const bool inside = (row < seqlen_q) & (col < seqlen_k);
    return inside & variant.mask_mod(batch, head, min(row, seqlen_q - 1), min(col, seqlen_k - 1));
  }
  // One row group's seen bitmap over a kBlockN-key tile, what visible_by_groups() reads, and
  // whether each of the tile's 16 x 16 groups in the row group is wholly seen or unseen (the
  // seen bits then say everything).
  struct RowGroupBits {
    uint64_t seen;  // the 64 bits from the word of the tile's first key group
    int group0;     // the key group of bit 0
    bool whole_or_unseen;
  };
  template <int kBlockN>
  __device__ __forceinline__ RowGroupBits tile_row_group(int row, int tile_col0) const {
    const int word = tile_col0 / kMaskRangeRows / 32;
    const int* bits = entries + group_of(row) * row_ints + kMaskRangeInts + word;
    auto run = [&](const int* at) {
      return uint32_t(__ldg(at)) | uint64_t(uint32_t(__ldg(at + 1))) << 32;
    };
    const uint64_t seen = run(bits);
    const uint64_t span = key_block_span<kBlockN>(tile_col0 / kBlockN);
    return {seen, word * 32, ((seen & ~run(bits + words)) & span) == 0};
  }
  // visible(row, col) for a row of the group and a key of the tile, where whole_or_unseen.
  __device__ __forceinline__ bool visible_by_groups(RowGroupBits const& bits, int row,
                                                    int col) const {
    return row < seqlen_q && col < seqlen_k &&
           ((bits.seen >> (col / kMaskRangeRows - bits.group0)) & 1);
  }
};

// The score modifier of a variant with a score_mod: it sees the scaled score, so the call's
// scale_log2 is log2(e) alone (codegen/score_mods.py), and its gradient is by that score, the
// backward's unit. A masked score (-inf) has P = 0 and gets no gradient. A tile's scores outside
// the sequence (its padding rows and keys, which the mask hides) are left alone; the snippets run
// there on the nearest position inside, their answer dropped, so they never index their tensors
// past the sequence and no branch splits the tile (as VariantMask::visible).
template <class V>
struct VariantScore {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = V::kUnitGradient;
  static constexpr bool kReadsHead = true;
  V variant;
  float scale;
  int batch;
  int head;
  int seqlen_q;
  int seqlen_k;

  __device__ __forceinline__ VariantScore(AttentionParams const& p, int batch, int head,
                                          int /*offset*/)
      : variant(p), scale(p.softmax_scale), batch(batch), head(head),
        seqlen_q(p.cu_seqlens_q == nullptr ? p.seqlen_q
                                           : p.cu_seqlens_q[batch + 1] - p.cu_seqlens_q[batch]),
        seqlen_k(p.cu_seqlens_k == nullptr ? p.seqlen_k
                                           : p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch]) {}
  __device__ __forceinline__ bool inside(int row, int col) const {
    return (row < seqlen_q) & (col < seqlen_k);
  }
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    const float modified = variant.score_mod(score * scale, batch, head, min(row, seqlen_q - 1),
                                             min(col, seqlen_k - 1));
    return inside(row, col) ? modified : score;
  }
  __device__ __forceinline__ float derivative(float modified, int row, int col) const {
    const float gradient = variant.score_mod_grad(modified, batch, head, min(row, seqlen_q - 1),
                                                  min(col, seqlen_k - 1));
    return inside(row, col) & !isinf(modified) ? gradient : 0.f;
  }
};

// The mask policy of a variant with a mask_mod in decode kernels (flash_attn_with_kvcache), which
// compute no block ranges: every key up to the sequence's cache length is visited and every tile
// runs the mask_mod, with q_idx the new token's position in the sequence (offset: the keys before
// the first new token). Rows past the new tokens, and new tokens before the sequence's first key
// (a cache shorter than the new tokens), see nothing: the mask_mod never sees them (it runs on the
// nearest position inside, its answer dropped, as in VariantMask::visible).
template <class V>
struct DecodeVariantMask : NoMask {  // NoMask's key range: every key up to seqlen_k
  static constexpr bool kHidesKeys = true;
  static constexpr bool kPerHead = V::kPerHead;
  V variant;
  int batch;
  int head = 0;
  int seqlen_q;
  int offset;

  __device__ __forceinline__ DecodeVariantMask(AttentionParams const& p, int batch, int seqlen_k,
                                               int offset)
      : NoMask(p, batch, seqlen_k, offset), variant(p), batch(batch), seqlen_q(p.seqlen_q),
        offset(offset) {}
  __device__ __forceinline__ DecodeVariantMask for_head(int h) const {
    DecodeVariantMask view = *this;
    view.head = h;
    return view;
  }
  __device__ __forceinline__ bool visible(int row, int col) const {
    const bool inside = (row < seqlen_q) & (row + offset >= 0) & (col < seqlen_k);
    const int q_idx = max(0, min(row, seqlen_q - 1) + offset);
    return inside & variant.mask_mod(batch, head, q_idx, max(0, min(col, seqlen_k - 1)));
  }
};

// A variant's score_mod in decode kernels: q_idx is the new token's position in the sequence
// (offset: the sequence's keys before the first new token). A tile's scores outside the
// sequence (padding rows and keys, tokens before its first key) are left alone (the score_mod
// runs on the nearest position inside, its answer dropped); the mask hides them.
template <class V>
struct DecodeVariantScore : VariantScore<V> {
  int offset;

  __device__ __forceinline__ DecodeVariantScore(AttentionParams const& p, int batch, int head,
                                                int offset)
      : VariantScore<V>(p, batch, head, offset), offset(offset) {}
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    const int keys = this->seqlen_q + offset;  // the sequence's keys: up to the last new token
    const bool inside = (row < this->seqlen_q) & (row + offset >= 0) & (col < keys);
    const float modified = this->variant.score_mod(
        score * this->scale, this->batch, this->head,
        max(0, min(row, this->seqlen_q - 1) + offset), max(0, min(col, keys - 1)));
    return inside ? modified : score;
  }
};

template <class V>
struct DecodeMask<VariantMask<V>> {
  using type = DecodeVariantMask<V>;
};
template <class V>
constexpr bool kMasksEveryTile<DecodeVariantMask<V>> = true;
template <class V>
struct DecodeScoreMod<VariantScore<V>> {
  using type = DecodeVariantScore<V>;
};

// Block (group, sequence x mask head), one warp per row, each lane a key of every 32: the
// group's first and end key, the run of keys all its rows see (a row whose count fills its span
// sees a run), and its two bitmaps, gathered in shared memory from each warp's ballots (a key
// group is wholly seen when every row of the group inside the sequence sees each of its keys
// inside it).
template <class V>
__global__ void __launch_bounds__(32 * kMaskRangeRows)
    mask_rows_kernel(CUTE_GRID_CONSTANT AttentionParams const p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  extern __shared__ uint32_t bitmaps[];  // seen, then wholly seen
  const int group = blockIdx.x;
  const int batch = blockIdx.y / mask_heads<V>(p);
  const int head = blockIdx.y % mask_heads<V>(p);
  const DenseSeqs seq(p, batch);
  const V variant(p);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = group * kMaskRangeRows + warp;
  const bool row_inside = row < seq.seqlen_q;
  const int words = mask_block_words(p);
  for (int w = threadIdx.x; w < 2 * words; w += blockDim.x) bitmaps[w] = w < words ? 0u : ~0u;
  __syncthreads();
  int first = INT_MAX, last = -1, count = 0;
  for (int col0 = 0; col0 < seq.seqlen_k; col0 += 32) {  // every lane of the warp, for the ballot
    const int col = col0 + lane;
    const bool visible = row_inside & (col < seq.seqlen_k) &
                         variant.mask_mod(batch, head, min(row, seq.seqlen_q - 1),
                                          min(col, seq.seqlen_k - 1));
    if (visible) {
      first = min(first, col);
      last = col;
      ++count;
    }
    const uint32_t seen = __ballot_sync(0xffffffffu, visible);
    const uint32_t unseen = __ballot_sync(0xffffffffu, col < seq.seqlen_k) & ~seen;
    if (lane == 0 && row_inside) {
      // Cols col0 .. col0 + 31 are key groups 2k and 2k + 1 (k = col0 / 32).
      const int key_group = col0 / kMaskRangeRows;
      const uint32_t any = (seen & 0xffffu ? 1u : 0u) | (seen >> 16 ? 2u : 0u);
      const uint32_t partial = (unseen & 0xffffu ? 1u : 0u) | (unseen >> 16 ? 2u : 0u);
      if (any) atomicOr(&bitmaps[key_group / 32], any << (key_group % 32));
      if (partial) atomicAnd(&bitmaps[words + key_group / 32], ~(partial << (key_group % 32)));
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
    last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
    count += __shfl_xor_sync(0xffffffffu, count, offset);
  }
  __shared__ int4 rows[kMaskRangeRows];
  if (lane == 0) rows[warp] = make_int4(first, last, count, row_inside);
  __syncthreads();
  int* entry = p.mask_ranges + (int64_t(blockIdx.y) * gridDim.x + group) * mask_row_ints(p);
  for (int w = threadIdx.x; w < 2 * words; w += blockDim.x) {
    entry[kMaskRangeInts + w] = int(bitmaps[w]);
  }
  if (threadIdx.x != 0) return;
  MaskRange range{INT_MAX, 0, 0, INT_MAX};
  for (int r = 0; r < kMaskRangeRows; ++r) {
    const int4 row_range = rows[r];  // first, last, count, inside the sequence
    if (!row_range.w) continue;
    range.first = min(range.first, row_range.x);
    range.end = max(range.end, row_range.y + 1);
    const bool unbroken = row_range.z > 0 && row_range.z == row_range.y - row_range.x + 1;
    range.all_first = unbroken ? max(range.all_first, row_range.x) : INT_MAX;
    range.all_last = unbroken ? min(range.all_last, row_range.y) : -1;
  }
  *reinterpret_cast<MaskRange*>(entry) = range;
#endif
}

// Block per sequence (and mask head): the first keys as minima over later groups, the ends as
// maxima over earlier ones, each first at most its end (a group that sees nothing then visits
// nothing).
constexpr int kScanThreads = 1024;

template <class Op>
__device__ __forceinline__ int block_inclusive_scan(int value, Op op, int* scratch) {
  const int t = threadIdx.x;
  scratch[t] = value;
  __syncthreads();
  for (int stride = 1; stride < kScanThreads; stride *= 2) {
    const int other = t >= stride ? scratch[t - stride] : value;
    __syncthreads();
    value = op(value, other);
    scratch[t] = value;
    __syncthreads();
  }
  const int result = scratch[t];
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kScanThreads)
    mask_ranges_scan_kernel(CUTE_GRID_CONSTANT AttentionParams const p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  __shared__ int scratch[kScanThreads];
  const int groups = mask_range_groups(p);
  const int row_ints = mask_row_ints(p);
  int* entries = p.mask_ranges + int64_t(blockIdx.x) * groups * row_ints;
  auto ranges = [&](int g) -> MaskRange& {
    return *reinterpret_cast<MaskRange*>(entries + int64_t(g) * row_ints);
  };
  const auto min_op = [](int a, int b) { return min(a, b); };
  const auto max_op = [](int a, int b) { return max(a, b); };
  int carry = 0;  // ends: a running maximum, first to last
  for (int base = 0; base < groups; base += kScanThreads) {
    const int g = base + threadIdx.x;
    const int end = max(carry, block_inclusive_scan(g < groups ? ranges(g).end : 0, max_op,
                                                    scratch));
    if (g < groups) ranges(g).end = end;
    if (threadIdx.x == kScanThreads - 1) scratch[0] = end;
    __syncthreads();
    carry = scratch[0];
    __syncthreads();
  }
  carry = INT_MAX;  // firsts: a running minimum, last to first
  for (int base = ((groups - 1) / kScanThreads) * kScanThreads; base >= 0;
       base -= kScanThreads) {
    const int g = base + kScanThreads - 1 - threadIdx.x;  // reversed within the chunk
    const int first = min(carry, block_inclusive_scan(
                                     g < groups ? ranges(g).first : INT_MAX, min_op, scratch));
    if (g < groups) ranges(g).first = min(first, ranges(g).end);
    if (threadIdx.x == kScanThreads - 1) scratch[0] = first;
    __syncthreads();
    carry = scratch[0];
    __syncthreads();
  }
#endif
}

// Fills p.mask_ranges ((batch, mask_heads<V>(p), mask_range_groups(p), mask_row_ints(p)) ints)
// for the variant V.
template <class V>
cudaError_t compute_mask_ranges(AttentionParams const& p, cudaStream_t stream) {
  const int groups = mask_range_groups(p);
  const int masks = p.batch * mask_heads<V>(p);
  if (groups == 0 || masks == 0) return cudaSuccess;
  const int bitmap_bytes = 2 * mask_block_words(p) * 4;
  if (bitmap_bytes > 48 * 1024) {  // 3M keys: beyond, the bitmaps would need an opt-in
    return cudaErrorInvalidValue;
  }
  if (cudaError_t err = launch(mask_rows_kernel<V>, dim3(groups, masks), 32 * kMaskRangeRows,
                               bitmap_bytes, stream, p);
      err != cudaSuccess) {
    return err;
  }
  return launch(mask_ranges_scan_kernel, unsigned(masks), kScanThreads, 0, stream, p);
}

}  // namespace flashgen
