// Combines the splits of a split-KV launch: out = sum_s exp(lse_s - lse) * out_s with
// lse = log sum_s exp(lse_s), exactly as flashgen.merge_attention_states combines two parts (a
// split that saw no key has lse -inf and weight 0; a row no split saw gets 0 and -inf, or its
// sink).
#pragma once

#include <cmath>

#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"

namespace flashgen {

// Rows per head of a split's statistics: batch * seqlen_q, or a variable-length batch's total
// rows ((heads, total rows) statistics, as its softmax_lse).
__device__ __forceinline__ int split_rows(DecodeParams const& p) {
  return p.cu_seqlens_q == nullptr ? p.batch * p.seqlen_q : p.cu_seqlens_q[p.batch];
}

// One warp per output row (head, token) of the sequence blockIdx.y, 4 rows per block of 128
// threads over heads * seqlen_q rows (a variable-length batch's longest); the sequences that the
// split launch skipped (DecodeParams::min_seqlen_q) are skipped here too. The heads' sinks join
// the combined denominator here, not in the splits.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(128) combine_splits_kernel(const DecodeParams p) {
  constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  const DenseSeqs seq(p, int(blockIdx.y));
  if (seq.seqlen_q < p.min_seqlen_q || seq.seqlen_q > p.seqlen_q) return;
  const int local = blockIdx.x * 4 + threadIdx.x / 32;  // head * seqlen_q + token
  const int lane = threadIdx.x % 32;
  if (local >= p.heads * seq.seqlen_q) return;
  const int token = local % seq.seqlen_q;
  const int head = local / seq.seqlen_q;
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
}

}  // namespace flashgen
