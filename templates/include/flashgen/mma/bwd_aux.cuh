// The backward's two memory-bound helpers: D = rowsum(dO * O) before the main kernel, and the
// fp32 dQ workspace scaled and converted to the input type after it.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/common/params.h"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/softmax_d.cuh"

namespace flashgen {

// The per-row helpers' grids run over (batch, head) and its rows, or a variable-length batch's
// heads and their packed rows (BwdParams.q_view_rows): its per-row statistics and dQ workspace
// are (heads, total rows), so no row needs its sequence.
__host__ __device__ __forceinline__ int aux_grid_batch(BwdParams const& p) {
  return p.cu_seqlens_q != nullptr ? 1 : p.batch;
}
__host__ __device__ __forceinline__ int aux_grid_rows(BwdParams const& p) {
  return p.cu_seqlens_q != nullptr ? p.q_view_rows : p.seqlen_q;
}
__device__ __forceinline__ DenseSeqs aux_rows(BwdParams const& p, int batch_head) {
  if (p.cu_seqlens_q != nullptr) return DenseSeqs(p, DenseSeqs::AllRows{});
  return DenseSeqs(p, batch_head / p.heads);
}

// Blocks run over (batch, head) and within it over kDRowsPerBlock rows.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kAuxThreads) softmax_d_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  constexpr int kLanes = softmax_d_lanes(kHeadDim);
  constexpr int kRows = kDRowsPerBlock<kHeadDim>;
  const int blocks_per_head = (aux_grid_rows(p) + kRows - 1) / kRows;
  const int batch_head = int(blockIdx.x) / blocks_per_head;
  const int row = int(blockIdx.x) % blocks_per_head * kRows + int(threadIdx.x) / kLanes;
  const DenseSeqs seq = aux_rows(p, batch_head);
  const int head = batch_head % p.heads;
  const float sum = softmax_d_row<Element, kHeadDim>(p, seq, head, row, row < seq.seqlen_q);
  if (row < seq.seqlen_q && int(threadIdx.x) % kLanes == 0) {
    p.softmax_d[seq.row_stats_offset(p.heads, head) + row] = sum;
  }
#endif
}

// One thread per 8 columns of a dq row.
template <class Element, int kHeadDim, int kHeadDimPadded>
__global__ void __launch_bounds__(kAuxThreads) dq_convert_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  constexpr int kChunks = kHeadDim / 8;
  const int rows = aux_grid_rows(p);
  const int64_t index = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x;
  if (index >= int64_t(aux_grid_batch(p)) * p.heads * rows * kChunks) return;
  const int chunk = int(index % kChunks);
  const int64_t row_index = index / kChunks;  // (batch, head, row)
  const int row = int(row_index % rows);
  const int batch_head = int(row_index / rows);
  const DenseSeqs seq = aux_rows(p, batch_head);
  if (row >= seq.seqlen_q) return;  // past the packed rows of a variable-length batch
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
#endif
}

}  // namespace flashgen
