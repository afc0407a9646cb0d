// The Hopper backward's memory-bound helpers: before the main kernel, each row's D and lse in the
// row-padded layout its TMA loads read; after it, the fp32 dQ workspace scaled and converted to
// the input type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/softmax_d.cuh"

namespace flashgen::hopper {

// The row-padded per-row workspaces (D, lse * log2(e), dQ's, and a dQ state or semaphores per
// query block) hold each (sequence, head)'s query blocks of kBlockM rows in turn: a dense batch's
// as (batch, heads, query blocks of seqlen_q); a variable-length batch's (packed) per head as
// PackedQueryBlocks lays them out. Query block m_block of (seq, head) is per_head x head + first
// + m_block.
template <int kBlockM>
struct QueryBlockLayout {
  using Packed = PackedQueryBlocks<kBlockM>;
  int per_head;  // query blocks per head (packed), or per (batch, head)
  int first;     // the sequence's first query block in head 0

  __host__ __device__ __forceinline__ static int64_t dense_per_head(BwdParams const& p) {
    return (int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM;
  }
  // Every query block of the call (what the workspaces are sized for).
  __host__ __device__ __forceinline__ static int64_t total(BwdParams const& p) {
    return p.q_view_rows > 0 ? p.heads * Packed::per_head(p.q_view_rows, p.batch)
                             : int64_t(p.batch) * p.heads * dense_per_head(p);
  }
  // (The launcher's grids bound every query block index below 2^31.)
  __device__ __forceinline__ static QueryBlockLayout of(BwdParams const& p, DenseSeqs const& seq) {
    if (!seq.packed) {
      return {int(dense_per_head(p)), int(seq.batch * p.heads * dense_per_head(p))};
    }
    return {int(Packed::per_head(p.q_view_rows, p.batch)), Packed::first(seq.q_start, seq.batch)};
  }
  __device__ __forceinline__ int64_t index(int head, int m_block) const {
    return int64_t(head) * per_head + first + m_block;
  }

  // The other way: query block `index` of the workspaces as (batch, head, m_block), for the
  // helper kernels, whose grids run over the workspaces' query blocks (total). A packed batch's
  // index may fall in a gap: m_block is then past the sequence's rows.
  struct At {
    int batch, head, m_block;
  };
  __device__ __forceinline__ static At locate(BwdParams const& p, int64_t index) {
    if (p.q_view_rows == 0) {
      const int per_head = int(dense_per_head(p));
      const int batch_head = int(index / per_head);
      return {batch_head / p.heads, batch_head % p.heads, int(index % per_head)};
    }
    const int per_head = int(Packed::per_head(p.q_view_rows, p.batch));
    const int block = int(index % per_head);
    const int batch = Packed::sequence(p.cu_seqlens_q, p.batch, block);
    return {batch, int(index / per_head), block - Packed::first(p.cu_seqlens_q[batch], batch)};
  }
};

// Whether the main kernel writes every query block's dQ workspace before adding to it: its first
// (deterministic: its first turn's) key block stores its shares there (bwd_kernel's
// add_dq_shares), so the prepare kernel need not zero the workspace, and the conversion writes
// zeros for query blocks no key block reached. Not where the consumers add from registers.
template <class Traits>
__host__ __device__ __forceinline__ bool stores_first_dq(BwdParams const& p) {
  return p.dq_semaphore != nullptr || (!Traits::kDqFromRegisters && p.dq_state != nullptr);
}

// Whether a key block has written query block `query_block`'s dQ workspace (stores_first_dq).
template <class Traits>
__device__ __forceinline__ bool dq_written(BwdParams const& p, int64_t query_block) {
  if (p.dq_semaphore != nullptr) return p.dq_semaphore[query_block * Traits::kConsumers] > 0;
  return p.dq_state[query_block] == 2;
}

// Per (batch, head), rows padded to whole query blocks: D (0 past the sequence) and lse * log2(e)
// (+inf past the sequence and for rows that saw no key, so that their P is 0). kPrepareBlocks
// thread blocks per query block of the workspaces (QueryBlockLayout::total), each of
// kDRowsPerBlock rows; each also zeroes its query block's dQ state (stores_first_dq), or else
// its rows of the dQ workspace (a query block's floats are contiguous).
template <class Traits>
constexpr int kPrepareBlocks =
    (Traits::kBlockM + kDRowsPerBlock<Traits::kHeadDim> - 1) / kDRowsPerBlock<Traits::kHeadDim>;

template <class Traits>
__global__ void __launch_bounds__(kAuxThreads) bwd_prepare_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kLanes = softmax_d_lanes(kHeadDim);
  constexpr int kRows = kDRowsPerBlock<kHeadDim>;
  constexpr int kBlockM = Traits::kBlockM;
  const int64_t query_block = int64_t(blockIdx.x) / kPrepareBlocks<Traits>;
  const int first_row = int(blockIdx.x) % kPrepareBlocks<Traits> * kRows;  // in the query block
  const auto at = QueryBlockLayout<kBlockM>::locate(p, query_block);
  const DenseSeqs seq(p, at.batch);
  // (A sequence longer than the longest the caller gave is cut to it, as the main kernel does.)
  if (at.m_block * kBlockM >= min(seq.seqlen_q, p.seqlen_q)) return;
  const int block_row = first_row + int(threadIdx.x) / kLanes;
  const int row = at.m_block * kBlockM + block_row;
  const bool inside = row < seq.seqlen_q;
  const float d = softmax_d_row<Element, kHeadDim>(p, seq, at.head, row, inside);
  if (block_row < kBlockM && int(threadIdx.x) % kLanes == 0) {
    const float lse =
        inside ? p.softmax_lse[seq.row_stats_offset(p.heads, at.head) + row] : -INFINITY;
    const int64_t stats_row = query_block * kBlockM + block_row;
    p.softmax_d[stats_row] = d;
    p.softmax_lse_log2[stats_row] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
    if (stores_first_dq<Traits>(p) && p.dq_state != nullptr && block_row == 0) {
      p.dq_state[query_block] = 0;
    }
  }
  if (stores_first_dq<Traits>(p)) return;
  const int rows = min(kRows, kBlockM - first_row);
  float4* dq =
      reinterpret_cast<float4*>(p.dq_accum + (query_block * kBlockM + first_row) * kHeadDim);
  for (int i = int(threadIdx.x); i < rows * kHeadDim / 4; i += kAuxThreads) {
    dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#endif
}

// The workspace holds, per (batch, head, query block), kDqShares dQ shares one after the other
// (each consumer's: kDqRows x dq_cols(c), or its transpose) as a consumer's 128 threads'
// accumulator registers, 16 bytes per thread in turn
// (the order of bwd_kernel's adds). One block converts one query block: float4 i of a share is
// register group j = i / 128 of thread t = i % 128, which holds rows r and r + 8, columns c and
// c + 1 of the accumulator (wgmma's layout: warp w, lane l hold rows 16 w + l / 4 (+ 8), group j
// columns 8 j + 2 (l % 4) (+ 1)); a transposed share's rows are head-dim columns and its columns
// query rows. The block puts them in place in shared memory, then writes whole rows, 16 bytes per
// thread. Where the query block's tile exceeds static shared memory (head dim 256), its shares
// of the head dim's columns convert in blocks of their own.
template <class Traits>
struct DqConvert {
  static constexpr int kWidth = Traits::kHeadDim;
  // Rows padded so that a warp's writes spread over the banks: by 8 floats, the 8 rows its float2
  // writes reach start 8 banks apart; transposed, by 4, its 4 pairs of query rows start 8 apart.
  static constexpr int kPad = Traits::kDqTransposed ? 4 : 8;
  static constexpr bool kPerShare =
      Traits::kBlockM * (kWidth + kPad) * 4 > 48 * 1024 && !Traits::kDqSplitRows;
  static constexpr int kShares = kPerShare ? 1 : Traits::kDqShares;  // per block
  static constexpr int kCols = kPerShare ? Traits::kDqCols : kWidth;  // per block
  static constexpr int kStride = kCols + kPad;
  static_assert(!kPerShare || (!Traits::kDqTransposed && !Traits::kDqUneven));
  static_assert(Traits::kBlockM * kStride * 4 <= 48 * 1024, "the tile exceeds static memory");
  static constexpr int kBlocksPerQueryBlock = Traits::kDqShares / kShares;
};

template <class Traits>
__global__ void __launch_bounds__(kAuxThreads) bwd_dq_convert_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  using Convert = DqConvert<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlock4 = (Convert::kPerShare ? Traits::dq_floats(0) : Traits::kDqBlockFloats) / 4;
  constexpr int kStride = Convert::kStride;
  __shared__ alignas(16) float tile[kBlockM * kStride];
  // kBlocksPerQueryBlock thread blocks per query block of the workspaces.
  const int64_t query_block = int64_t(blockIdx.x) / Convert::kBlocksPerQueryBlock;
  const int first_share = int(blockIdx.x) % Convert::kBlocksPerQueryBlock;
  const auto at = QueryBlockLayout<kBlockM>::locate(p, query_block);
  const DenseSeqs seq(p, at.batch);
  const int row0 = at.m_block * kBlockM;
  if (row0 >= min(seq.seqlen_q, p.seqlen_q)) return;  // (cut as the prepare kernel does)
  const int head = at.head;
  const float4* in = reinterpret_cast<const float4*>(
      p.dq_accum + query_block * Traits::kDqBlockFloats + Traits::dq_offset(first_share));
  // (A query block no key block reached has zero gradients.)
  const bool written = !stores_first_dq<Traits>(p) || dq_written<Traits>(p, query_block);
  for (int i = int(threadIdx.x); i < kBlock4; i += kAuxThreads) {
    const float4 v = written ? in[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    // The block's share float4 i is in, and its index k there.
    const int share = Convert::kShares > 1 && i >= Traits::dq_floats(0) / 4 ? 1 : 0;
    const int k = i - Traits::dq_offset(share) / 4;
    const int j = k / 128;
    const int thread = k % 128;
    const int lane = thread % 32;
    int row = thread / 32 * 16 + lane / 4;  // the accumulator's
    int col = 8 * j + 2 * (lane % 4);
    if constexpr (Traits::kDqTransposed) {
      float* const at = &tile[col * kStride + Traits::dq_first_col(share) + row];
      at[0] = v.x;
      at[kStride] = v.y;
      at[8] = v.z;
      at[kStride + 8] = v.w;
    } else {
      if constexpr (Traits::kDqSplitRows) row += 64 * share;
      else col += Traits::dq_first_col(share);
      *reinterpret_cast<float2*>(&tile[row * kStride + col]) = make_float2(v.x, v.y);
      *reinterpret_cast<float2*>(&tile[(row + 8) * kStride + col]) = make_float2(v.z, v.w);
    }
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) +
                seq.q_offset(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, head) +
                Convert::kCols * first_share;
  constexpr int kChunksPerRow = Convert::kCols / 8;
  for (int i = int(threadIdx.x); i < kBlockM * kChunksPerRow; i += kAuxThreads) {
    const int row = i / kChunksPerRow;
    const int col = i % kChunksPerRow * 8;
    if (row0 + row >= seq.seqlen_q) break;
    Chunk8<Element> chunk;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 v = *reinterpret_cast<const float4*>(&tile[row * kStride + col + 4 * h]);
      chunk.x[4 * h] = Element(v.x * p.softmax_scale);
      chunk.x[4 * h + 1] = Element(v.y * p.softmax_scale);
      chunk.x[4 * h + 2] = Element(v.z * p.softmax_scale);
      chunk.x[4 * h + 3] = Element(v.w * p.softmax_scale);
    }
    *reinterpret_cast<Chunk8<Element>*>(dq + int64_t(row0 + row) * p.dq_row_stride + col) = chunk;
  }
#endif
}

}  // namespace flashgen::hopper
