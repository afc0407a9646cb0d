// Combines the splits of a split-KV launch in the last of its blocks to finish (no second
// kernel, so one launch a call): out = sum_s exp(lse_s - lse) * out_s with
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

// Combines row `row` of the splits' statistics, (token, head) of sequence `seq`, into o and
// softmax_lse: one warp, `lane` its thread. The head's sink joins the combined denominator here,
// not in the splits. The partials come from other blocks of the launch, read past L1.
template <class Element, int kHeadDim, class Seq>
__device__ __forceinline__ void combine_split_row(DecodeParams const& p, Seq const& seq,
                                                  int head, int token, int64_t row, int lane) {
  constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  const int64_t rows = int64_t(p.heads) * split_rows(p);  // a split's statistics
  const float sink = p.sinks == nullptr ? -INFINITY : p.sinks[head];
  float max_lse = sink;
  for (int s = lane; s < p.num_splits; s += 32) {
    max_lse = fmaxf(max_lse, __ldcg(p.lse_accum + s * rows + row));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffff, max_lse, offset));
  }
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int s = lane; s < p.num_splits; s += 32) {
      sum += expf(__ldcg(p.lse_accum + s * rows + row) - max_lse);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (max_lse != -INFINITY) sum += expf(sink - max_lse);
  const float lse = sum == 0.f ? -INFINITY : max_lse + logf(sum);

  float acc[kColsPerLane] = {};
  if (lse != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float lse_s = __ldcg(p.lse_accum + s * rows + row);
      if (lse_s == -INFINITY) continue;
      const float weight = expf(lse_s - lse);
      const float* part = p.o_accum + (int64_t(s) * rows + row) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i) {
        const int col = lane + 32 * i;
        if (col < kHeadDim) acc[i] += weight * __ldcg(part + col);
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

// Whether this block is the last of its tile's splits to finish, every split's partials then
// visible to it; that block resets the tile's counter for the next launch. Called by every
// thread of the block, after its partials are written.
__device__ __forceinline__ bool last_split_to_finish(DecodeParams const& p) {
  __threadfence();  // this block's partials, before its count
  int* counter = p.split_counters + (int64_t(blockIdx.z) * gridDim.x + blockIdx.x);
  bool last = false;
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == p.num_splits - 1;
    if (last) *counter = 0;
  }
  if (!__syncthreads_or(last)) return false;
  __threadfence();  // the others' partials, after their counts
  return true;
}

}  // namespace flashgen
