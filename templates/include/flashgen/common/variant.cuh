// Config-defined variants (codegen/variants.py): the config's C++ renders into a struct V with
// mask_mod(b, h, q_idx, kv_idx) and/or score_mod(score, b, h, q_idx, kv_idx) and
// score_mod_grad(...); VariantMask<V> and VariantScore<V> make it a mask policy (common/mask.cuh)
// and a score modifier (common/score_mod.cuh) that every kernel of both families takes.
//
// A predicate says nothing about which key blocks a query block may skip, so a call first runs
// compute_mask_ranges (once per batch of inputs: flashgen.block_mask keeps the result): a
// MaskRange per sequence and group of 16 query rows.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/variant_tensor.cuh"

namespace flashgen {

// Rows per entry of the mask's block ranges: every tile's block_m and block_n is a multiple.
constexpr int kMaskRangeRows = 16;

__host__ __device__ __forceinline__ int mask_range_groups(AttentionParams const& p) {
  return (p.seqlen_q + kMaskRangeRows - 1) / kMaskRangeRows;
}

// What the mask of one group of 16 query rows lets them see. Block ranges use first and end, made
// monotone (first a minimum over this and later groups, end a maximum over this and earlier
// ones) so that every family's block ranges agree, forward and backward (the hopper backward's
// deterministic dQ order counts on it). Every row sees the keys all_first..all_last (rows that see
// an unbroken run): tiles inside that run are not masked. Within masked tiles the mask_mod runs on
// every element: testing these ranges per element first costs more than it saves (H100,
// docs/performance.md section 5).
struct alignas(16) MaskRange {
  int first, end;
  int all_first, all_last;
};

// The mask policy of a variant with a mask_mod: params.mask_ranges holds the MaskRanges.
template <class V>
struct VariantMask {
  static constexpr bool kHidesKeys = true;
  V variant;
  int batch;
  int seqlen_q;
  int seqlen_k;
  int groups;
  const MaskRange* ranges;  // this sequence's
  mutable int all_see_block = -1;  // tile_needs_mask's query block, and the keys all its rows see
  mutable int all_see_first = 0;
  mutable int all_see_last = 0;

  __device__ __forceinline__ VariantMask(AttentionParams const& p, int batch, int seqlen_k,
                                         int /*offset*/)
      : variant(p), batch(batch),
        seqlen_q(p.cu_seqlens_q == nullptr ? p.seqlen_q
                                           : p.cu_seqlens_q[batch + 1] - p.cu_seqlens_q[batch]),
        seqlen_k(seqlen_k), groups(mask_range_groups(p)),
        ranges(reinterpret_cast<const MaskRange*>(p.mask_ranges) + int64_t(batch) * groups) {}

  __device__ __forceinline__ int group_of(int row) const {
    return min(groups - 1, row / kMaskRangeRows);
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_blocks() const {
    return (seqlen_k + kBlockN - 1) / kBlockN;
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_begin(int first_row) const {
    return min(key_blocks<kBlockN>(), ranges[group_of(first_row)].first / kBlockN);
  }
  template <int kBlockN>
  __device__ __forceinline__ int key_block_end(int last_row) const {
    return min(key_blocks<kBlockN>(), (ranges[group_of(last_row)].end + kBlockN - 1) / kBlockN);
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
  // The keys that every row of query block m_block sees, for the block asked about last: kernels
  // ask about one query block's tiles in turn, so the loads run once per query block, not in
  // every tile's softmax.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block) const {
    if (m_block != all_see_block) {
      all_see_block = m_block;
      all_see_first = 0;
      all_see_last = INT_MAX;
      const int first_group = m_block * (kBlockM / kMaskRangeRows);
      const int end_group = min(groups, first_group + kBlockM / kMaskRangeRows);
      for (int g = first_group; g < end_group; ++g) {
        all_see_first = max(all_see_first, ranges[g].all_first);
        all_see_last = min(all_see_last, ranges[g].all_last);
      }
    }
    const int first_col = n_block * kBlockN;
    const int last_col = first_col + kBlockN - 1;
    return last_col >= seqlen_k || first_col < all_see_first || last_col > all_see_last;
  }
  // Rows past the sequence (a tile's padding) see nothing, and the mask_mod never sees them.
  __device__ __forceinline__ bool visible(int row, int col) const {
    return row < seqlen_q && col < seqlen_k && variant.mask_mod(batch, 0, row, col);
  }
};

// The score modifier of a variant with a score_mod: it sees the scaled score, so the call's
// scale_log2 is log2(e) alone (codegen/score_mods.py), and its gradient is by that score, the
// backward's unit. A masked score (-inf) has P = 0 and gets no gradient.
template <class V>
struct VariantScore {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = V::kUnitGradient;
  static constexpr bool kReadsHead = true;
  V variant;
  float scale;
  int batch;
  int head;

  __device__ __forceinline__ VariantScore(AttentionParams const& p, int batch, int head,
                                          int /*offset*/)
      : variant(p), scale(p.softmax_scale), batch(batch), head(head) {}
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    return variant.score_mod(score * scale, batch, head, row, col);
  }
  __device__ __forceinline__ float derivative(float modified, int row, int col) const {
    return isinf(modified) ? 0.f : variant.score_mod_grad(modified, batch, head, row, col);
  }
};

// Block (group, sequence), one warp per row: each row's first and last visible key and how many
// it sees (a row whose count fills the span sees an unbroken run).
template <class V>
__global__ void __launch_bounds__(32 * kMaskRangeRows)
    mask_rows_kernel(CUTE_GRID_CONSTANT AttentionParams const p) {
  const int group = blockIdx.x;
  const int batch = blockIdx.y;
  const DenseSeqs seq(p, batch);
  const V variant(p);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = group * kMaskRangeRows + warp;
  int first = INT_MAX, last = -1, count = 0;
  if (row < seq.seqlen_q) {
    for (int col = lane; col < seq.seqlen_k; col += 32) {
      if (variant.mask_mod(batch, 0, row, col)) {
        first = min(first, col);
        last = col;
        ++count;
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
    last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
    count += __shfl_xor_sync(0xffffffffu, count, offset);
  }
  __shared__ int4 rows[kMaskRangeRows];
  if (lane == 0) rows[warp] = make_int4(first, last, count, row < seq.seqlen_q);
  __syncthreads();
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
  reinterpret_cast<MaskRange*>(p.mask_ranges)[int64_t(batch) * gridDim.x + group] = range;
}

// Block per sequence: the first keys as minima over later groups, the ends as maxima over earlier
// ones, each first at most its end (a group that sees nothing then visits nothing).
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
  __shared__ int scratch[kScanThreads];
  const int groups = mask_range_groups(p);
  MaskRange* ranges = reinterpret_cast<MaskRange*>(p.mask_ranges) + int64_t(blockIdx.x) * groups;
  const auto min_op = [](int a, int b) { return min(a, b); };
  const auto max_op = [](int a, int b) { return max(a, b); };
  int carry = 0;  // ends: a running maximum, first to last
  for (int base = 0; base < groups; base += kScanThreads) {
    const int g = base + threadIdx.x;
    const int end = max(carry, block_inclusive_scan(g < groups ? ranges[g].end : 0, max_op,
                                                    scratch));
    if (g < groups) ranges[g].end = end;
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
                                     g < groups ? ranges[g].first : INT_MAX, min_op, scratch));
    if (g < groups) ranges[g].first = min(first, ranges[g].end);
    if (threadIdx.x == kScanThreads - 1) scratch[0] = first;
    __syncthreads();
    carry = scratch[0];
    __syncthreads();
  }
}

// Fills p.mask_ranges ((batch, mask_range_groups(p)) MaskRange) for the variant V.
template <class V>
cudaError_t compute_mask_ranges(AttentionParams const& p, cudaStream_t stream) {
  const int groups = mask_range_groups(p);
  if (groups == 0 || p.batch == 0) return cudaSuccess;
  mask_rows_kernel<V><<<dim3(groups, p.batch), 32 * kMaskRangeRows, 0, stream>>>(p);
  mask_ranges_scan_kernel<<<p.batch, kScanThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashgen
