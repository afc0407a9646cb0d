// Combines the splits of a split-KV launch: out = sum_s exp(lse_s - lse) * out_s with
// lse = log sum_s exp(lse_s), exactly as flashgen.merge_attention_states combines two parts (a
// split that saw no key has lse -inf and weight 0; a row no split saw gets 0 and -inf).
#pragma once

#include <cmath>

#include "flashgen/common/params.h"

namespace flashgen {

// One warp per output row (sequence, head, token), 4 rows per block of 128 threads.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(128) combine_splits_kernel(const DecodeParams p) {
  constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  const int rows = p.batch * p.heads * p.seqlen_q;
  const int row = blockIdx.x * 4 + threadIdx.x / 32;  // ((batch * heads) + head) * seqlen_q + t
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;

  float max_lse = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) max_lse = fmaxf(max_lse, p.lse_accum[s * rows + row]);
  for (int offset = 16; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffff, max_lse, offset));
  }
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(p.lse_accum[s * rows + row] - max_lse);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
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

  const int token = row % p.seqlen_q;
  const int head = row / p.seqlen_q % p.heads;
  const int batch = row / p.seqlen_q / p.heads;
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
