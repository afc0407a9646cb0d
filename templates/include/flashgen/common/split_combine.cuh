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

// One row combined from n partial results (lse_s, out_s): out = sum_s exp(lse_s - lse) * out_s,
// lse = log(sum_s exp(lse_s) + exp(sink)). One warp: `lane` holds columns lane + 32 i.
// lse_of(s) and part_of(s, col) read the partials wherever they are. The partials are read
// kBatch at a time, all in flight together: a row's combine is a chain of reads from L2 (the
// other blocks' partials), one round trip per batch instead of two per partial.
template <int kHeadDim>
struct CombinedRow {
  static constexpr int kColsPerLane = (kHeadDim + 31) / 32;
  static constexpr int kBatch = 8;
  float lse;
  float acc[kColsPerLane] = {};

  template <class LseOf, class PartOf>
  __device__ __forceinline__ CombinedRow(int n, float sink, LseOf&& lse_of, PartOf&& part_of,
                                         int lane) {
    // Lane s keeps partial s's lse (the first 32), which the batches below take by shuffle.
    const float first = lane < n ? lse_of(lane) : -INFINITY;
    float max_lse = fmaxf(sink, first);
    for (int s = lane + 32; s < n; s += 32) max_lse = fmaxf(max_lse, lse_of(s));
    for (int offset = 16; offset > 0; offset /= 2) {
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffff, max_lse, offset));
    }
    float sum = 0.f;
    if (max_lse != -INFINITY) {
      sum = expf(first - max_lse);
      for (int s = lane + 32; s < n; s += 32) sum += expf(lse_of(s) - max_lse);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
    if (max_lse != -INFINITY) sum += expf(sink - max_lse);
    lse = sum == 0.f ? -INFINITY : max_lse + logf(sum);
    if (lse == -INFINITY) return;
    // Every partial row is written (0 with lse -inf where its part saw no key).
    for (int s0 = 0; s0 < n; s0 += kBatch) {
      float lse_s[kBatch], part[kBatch][kColsPerLane];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int s = s0 + u;
        const float shuffled = __shfl_sync(0xffffffff, first, s % 32);
        lse_s[u] = s >= n ? -INFINITY : s < 32 ? shuffled : lse_of(s);
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) {
          const int col = lane + 32 * i;
          part[u][i] = s < n && col < kHeadDim ? part_of(s, col) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float weight = lse_s[u] == -INFINITY ? 0.f : expf(lse_s[u] - lse);
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) acc[i] += weight * part[u][i];
      }
    }
  }
};

// Writes a combined row as (token, head) of sequence `seq`'s output and as its softmax_lse row.
template <class Element, int kHeadDim, class Seq>
__device__ __forceinline__ void write_output_row(DecodeParams const& p, Seq const& seq, int head,
                                                 int token, int64_t row,
                                                 CombinedRow<kHeadDim> const& combined,
                                                 int lane) {
  Element* out = static_cast<Element*>(p.o) +
                 seq.q_offset(p.o_batch_stride, p.o_row_stride, p.o_head_stride, head) +
                 token * p.o_row_stride;
#pragma unroll
  for (int i = 0; i < CombinedRow<kHeadDim>::kColsPerLane; ++i) {
    const int col = lane + 32 * i;
    if (col < kHeadDim) out[col] = Element(combined.acc[i]);
  }
  if (lane == 0) p.softmax_lse[row] = combined.lse;
}

// Combines row `row` of the splits' statistics, (token, head) of sequence `seq`, into o and
// softmax_lse: one warp, `lane` its thread. The head's sink joins the combined denominator here,
// not in the splits. The partials come from other blocks of the launch, read past L1.
template <class Element, int kHeadDim, class Seq>
__device__ __forceinline__ void combine_split_row(DecodeParams const& p, Seq const& seq,
                                                  int head, int token, int64_t row, int lane) {
  const int64_t rows = int64_t(p.heads) * split_rows(p);  // a split's statistics
  const CombinedRow<kHeadDim> combined(
      p.num_splits, p.sinks == nullptr ? -INFINITY : p.sinks[head],
      [&](int s) { return __ldcg(p.lse_accum + s * rows + row); },
      [&](int s, int col) { return __ldcg(p.o_accum + (s * rows + row) * kHeadDim + col); },
      lane);
  write_output_row<Element, kHeadDim>(p, seq, head, token, row, combined, lane);
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
