// The backward's two memory-bound helpers: D = rowsum(dO * O) before the main kernel, and the
// fp32 dQ workspace scaled and converted to the input type after it.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"

namespace flashgen {

template <class Element>
struct alignas(16) Chunk8 {
  Element x[8];
};

constexpr int kAuxThreads = 256;

// D = rowsum(dO * O) reads each row as 16-byte chunks, one per lane, with the fewest lanes (a
// power of two) that cover a row: 8 at hd64, so a warp reads 4 rows. One warp per row left 24
// of 32 lanes idle at hd64: 117 us for 134 MB on an H100, against 53 this way.
constexpr int softmax_d_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < head_dim / 8) lanes *= 2;
  return lanes;
}

template <int kHeadDim>
constexpr int kDRowsPerBlock = kAuxThreads / softmax_d_lanes(kHeadDim);

// Blocks run over (batch, head) and within it over kDRowsPerBlock rows.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kAuxThreads) softmax_d_kernel(const BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kLanes = softmax_d_lanes(kHeadDim);
  static_assert(kHeadDim % 8 == 0 && kLanes <= 32);
  constexpr int kRows = kDRowsPerBlock<kHeadDim>;
  const int blocks_per_head = (p.seqlen_q + kRows - 1) / kRows;
  const int batch_head = int(blockIdx.x) / blocks_per_head;
  const int row = int(blockIdx.x) % blocks_per_head * kRows + int(threadIdx.x) / kLanes;
  const int chunk = int(threadIdx.x) % kLanes;
  const DenseSeqs seq(p, batch_head / p.heads);
  const int head = batch_head % p.heads;
  float sum = 0.f;
  if (row < seq.seqlen_q && chunk < kChunks) {
    const auto* dout = static_cast<const Element*>(p.dout) +
                       seq.q_offset(p.do_batch_stride, p.do_row_stride, p.do_head_stride, head) +
                       row * p.do_row_stride;
    const auto* out = static_cast<const Element*>(p.o) +
                      seq.q_offset(p.o_batch_stride, p.o_row_stride, p.o_head_stride, head) +
                      row * p.o_row_stride;
    const auto d = reinterpret_cast<const Chunk8<Element>*>(dout)[chunk];
    const auto o = reinterpret_cast<const Chunk8<Element>*>(out)[chunk];
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += float(d.x[j]) * float(o.x[j]);
  }
  // Sums over each group of kLanes lanes (xor offsets below kLanes stay inside it); every lane
  // takes part, those past the end of the rows with zeros.
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffff, sum, offset);
  }
  if (row < seq.seqlen_q && chunk == 0) p.softmax_d[seq.row_stats_offset(p.heads, head) + row] = sum;
}

// One thread per 8 columns of a dq row.
template <class Element, int kHeadDim, int kHeadDimPadded>
__global__ void __launch_bounds__(kAuxThreads) dq_convert_kernel(const BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;
  const int64_t index = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x;
  if (index >= int64_t(p.batch) * p.heads * p.seqlen_q * kChunks) return;
  const int chunk = int(index % kChunks);
  const int64_t row_index = index / kChunks;  // (batch, head, row)
  const int row = int(row_index % p.seqlen_q);
  const int batch_head = int(row_index / p.seqlen_q);
  const DenseSeqs seq(p, batch_head / p.heads);
  if (row >= seq.seqlen_q) return;  // past a shorter sequence of a variable-length batch
  const int head = batch_head % p.heads;
  const float4* acc = reinterpret_cast<const float4*>(
      p.dq_accum + (seq.row_stats_offset(p.heads, head) + row) * kHeadDimPadded + chunk * 8);
  const float4 lo = acc[0], hi = acc[1];
  const float values[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  Chunk8<Element> result;
#pragma unroll
  for (int j = 0; j < 8; ++j) result.x[j] = Element(values[j] * p.softmax_scale);
  auto* dq = static_cast<Element*>(p.dq) +
             seq.q_offset(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, head) +
             row * p.dq_row_stride;
  reinterpret_cast<Chunk8<Element>*>(dq)[chunk] = result;
}

}  // namespace flashgen
