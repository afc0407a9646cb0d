// The Hopper backward's memory-bound helpers: before the main kernel, each row's D and lse in the
// row-padded layout its TMA loads read; after it, the fp32 dQ workspace scaled and converted to
// the input type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/softmax_d.cuh"

namespace flashgen::hopper {

// Per (batch, head), rows padded to whole query blocks: D (0 past the sequence) and lse * log2(e)
// (+inf past the sequence and for rows that saw no key, so that their P is 0).
template <class Traits>
__global__ void __launch_bounds__(kAuxThreads) bwd_prepare_kernel(const BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kLanes = softmax_d_lanes(kHeadDim);
  constexpr int kRows = kDRowsPerBlock<kHeadDim>;
  const int padded_rows = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * Traits::kBlockM;
  const int blocks_per_head = (padded_rows + kRows - 1) / kRows;
  const int batch_head = int(blockIdx.x) / blocks_per_head;
  const int row = int(blockIdx.x) % blocks_per_head * kRows + int(threadIdx.x) / kLanes;
  const DenseSeqs seq(p, batch_head / p.heads);
  const int head = batch_head % p.heads;
  const bool inside = row < seq.seqlen_q;
  const float d = softmax_d_row<Element, kHeadDim>(p, seq, head, row, inside);
  if (row < padded_rows && int(threadIdx.x) % kLanes == 0) {
    const float lse = inside ? p.softmax_lse[seq.row_stats_offset(p.heads, head) + row] : -INFINITY;
    const int64_t at = int64_t(batch_head) * padded_rows + row;
    p.softmax_d[at] = d;
    p.softmax_lse_log2[at] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
  }
}

// The workspace holds, per (batch, head, query block), each consumer's dQ share (64 rows x
// kDqCols) as its 128 threads' accumulator registers, 16 bytes per thread in turn (bwd_kernel's
// staging). A thread here takes one such float4: rows r and r + 8, columns c and c + 1 of the
// share (wgmma's accumulator layout: warp w, lane l hold rows 16 w + l / 4 (+ 8), register
// group j columns 8 j + 2 (l % 4) (+ 1)).
template <class Traits>
__global__ void __launch_bounds__(kAuxThreads) bwd_dq_convert_kernel(const BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kShare4 = Traits::kDqFloats / 4;
  constexpr int kBlock4 = Traits::kConsumers * kShare4;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t index = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x;
  if (index >= int64_t(p.batch) * p.heads * m_blocks * kBlock4) return;
  const float4 v = reinterpret_cast<const float4*>(p.dq_accum)[index];
  const int64_t query_block = index / kBlock4;  // (batch, head, m_block)
  const int in_block = int(index % kBlock4);
  const int consumer = in_block / kShare4;
  const int j = in_block % kShare4 / 128;
  const int thread = in_block % 128;
  const int lane = thread % 32;
  int row = int(query_block % m_blocks) * kBlockM + thread / 32 * 16 + lane / 4;
  int col = 8 * j + 2 * (lane % 4);
  if constexpr (Traits::kDqSplitRows) row += 64 * consumer;
  else col += Traits::kDqCols * consumer;
  const int batch_head = int(query_block / m_blocks);
  const DenseSeqs seq(p, batch_head / p.heads);
  Element* dq = static_cast<Element*>(p.dq) +
                seq.q_offset(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
                             batch_head % p.heads) + col;
  const float values[2][2] = {{v.x, v.y}, {v.z, v.w}};
  for (int h = 0; h < 2; ++h, row += 8) {
    if (row >= seq.seqlen_q) break;
    Element pair[2] = {Element(values[h][0] * p.softmax_scale),
                       Element(values[h][1] * p.softmax_scale)};
    *reinterpret_cast<uint32_t*>(dq + int64_t(row) * p.dq_row_stride) =
        *reinterpret_cast<uint32_t*>(pair);
  }
}

}  // namespace flashgen::hopper
