// Combines the splits of a split-KV launch: out = sum_s exp(lse_s - lse) * out_s with
// lse = log sum_s exp(lse_s), exactly as flashgen.merge_attention_states combines two parts (a
// split that saw no key has lse -inf and weight 0; a row no split saw gets 0 and -inf, or its
// sink).
#pragma once

#include <cmath>

#include "flashgen/common/params.h"

namespace flashgen {

// Rows per head of a split's statistics: batch * seqlen_q, or a variable-length batch's total
// rows ((heads, total rows) statistics, as its softmax_lse).
__device__ __forceinline__ int split_rows(DecodeParams const& p) {
  return p.cu_seqlens_q == nullptr ? p.batch * p.seqlen_q : p.cu_seqlens_q[p.batch];
}

// One warp per output row (sequence, head, token), 4 rows per block of 128 threads; the grid
// covers batch * heads * seqlen_q rows, at least those of a variable-length batch. The heads'
// sinks join the combined denominator here, not in the splits.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(128) combine_splits_kernel(const DecodeParams p) {
  constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int per_head = packed ? split_rows(p) : p.seqlen_q;  // a statistic's rows per head
  const int rows = (packed ? 1 : p.batch) * p.heads * per_head;
  const int row = blockIdx.x * 4 + threadIdx.x / 32;  // ((batch * heads) + head) * per_head + t
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int token = row % per_head;  // a variable-length batch's: its packed row
  const int head = row / per_head % p.heads;
  const int batch = row / per_head / p.heads;

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

  Element* out = static_cast<Element*>(p.o) + batch * p.o_batch_stride + token * p.o_row_stride +
                 head * p.o_head_stride;
#pragma unroll
  for (int i = 0; i < kColsPerLane; ++i) {
    const int col = lane + 32 * i;
    if (col < kHeadDim) out[col] = Element(acc[i]);
  }
  if (lane == 0) p.softmax_lse[row] = lse;
}

}  // namespace flashgen
