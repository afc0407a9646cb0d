// Combines the splits of a split-KV launch: out = sum_s exp(lse_s - lse) * out_s with
// lse = log sum_s exp(lse_s), exactly as flashgen.merge_attention_states combines two parts (a
// split that saw no key has lse -inf and weight 0; a row no split saw gets 0 and -inf, or its
// sink).
#pragma once

#include <climits>
#include <cmath>

#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"

namespace flashgen {

// Rows per head of a split's statistics: batch * seqlen_q, or a variable-length batch's total
// rows ((heads, total rows) statistics, as its softmax_lse).
__device__ __forceinline__ int split_rows(DecodeParams const& p) {
  return p.cu_seqlens_q == nullptr ? p.batch * p.seqlen_q : p.cu_seqlens_q[p.batch];
}

// The combine's rows, 4 to a block of 128 threads: (head, token) of each sequence (y), or of a
// variable-length batch's packed rows (one sequence's or another's: a grid over the packed rows
// launches none for the rows a dense batch of the longest would pad the others to). x 0: too
// many for a grid.
inline dim3 combine_grid(DecodeParams const& p) {
  const int64_t rows = int64_t(p.heads) * (p.cu_seqlens_q == nullptr ? p.seqlen_q : p.q_view_rows);
  const int64_t blocks = (rows + 3) / 4;
  const int64_t sequences = p.cu_seqlens_q == nullptr ? p.batch : 1;
  if (blocks > INT_MAX || sequences > 65535) return dim3(0);
  return dim3(unsigned(blocks), unsigned(sequences));
}

// One warp per output row; the sequences that the split launch skipped
// (DecodeParams::min_seqlen_q) are skipped here too. The heads' sinks join the combined
// denominator here, not in the splits.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(128) combine_splits_kernel(const DecodeParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  const int64_t local = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // head x rows + row
  const int lane = threadIdx.x % 32;
  int batch = blockIdx.y, head, token;
  if (p.cu_seqlens_q == nullptr) {
    if (local >= int64_t(p.heads) * p.seqlen_q) return;
    head = int(local / p.seqlen_q);
    token = int(local % p.seqlen_q);
  } else {
    head = int(local / p.q_view_rows);
    const int row = int(local % p.q_view_rows);
    if (head >= p.heads || row >= p.cu_seqlens_q[p.batch]) return;  // spare rows
    batch = sequence_of_row(p.cu_seqlens_q, p.batch, row);
    token = row - p.cu_seqlens_q[batch];
  }
  const DenseSeqs seq(p, batch);
  if (seq.seqlen_q < p.min_seqlen_q || seq.seqlen_q > p.seqlen_q) return;
  const int64_t rows = int64_t(p.heads) * split_rows(p);  // a split's statistics
  const int64_t row = seq.row_stats_offset(p.heads, head) + token;

  const float sink = p.sinks == nullptr ? -INFINITY : p.sinks[head];
  float max_lse = sink;
  for (int s = lane; s < p.num_splits; s += 32) max_lse = fmaxf(max_lse, p.lse_accum[s * rows + row]);
  for (int offset = 16; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffff, max_lse, offset));
  }
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(p.lse_accum[s * rows + row] - max_lse);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (max_lse != -INFINITY) sum += expf(sink - max_lse);
  const float lse = sum == 0.f ? -INFINITY : max_lse + logf(sum);

  float acc[kColsPerLane] = {};
  if (lse != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float lse_s = p.lse_accum[s * rows + row];
      if (lse_s == -INFINITY) continue;
      const float weight = expf(lse_s - lse);
      const float* part = p.o_accum + (int64_t(s) * rows + row) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i) {
        const int col = lane + 32 * i;
        if (col < kHeadDim) acc[i] += weight * part[col];
      }
    }
  }

  Element* out = static_cast<Element*>(p.o) +
                 seq.q_offset(p.o_batch_stride, p.o_row_stride, p.o_head_stride, head) +
                 token * p.o_row_stride;
#pragma unroll
  for (int i = 0; i < kColsPerLane; ++i) {
    const int col = lane + 32 * i;
    if (col < kHeadDim) out[col] = Element(acc[i]);
  }
  if (lane == 0) p.softmax_lse[row] = lse;
#endif
}

}  // namespace flashgen
