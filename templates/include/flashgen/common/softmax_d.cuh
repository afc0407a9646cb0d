// D = rowsum(dO * O), the backward's per-row term of dS = P (dP - D), read as 16-byte chunks: each
// row by the fewest lanes (a power of two) that cover it, 8 at head dim 64, so a warp reads 4
// rows. One warp per row left 24 of 32 lanes idle at head dim 64: 117 us for 134 MB on an H100,
// against 53 this way.
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

// Threads per block of the backward's memory-bound helper kernels.
constexpr int kAuxThreads = 256;

constexpr int softmax_d_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < head_dim / 8) lanes *= 2;
  return lanes;
}

// Rows per kAuxThreads-thread block.
template <int kHeadDim>
constexpr int kDRowsPerBlock = kAuxThreads / softmax_d_lanes(kHeadDim);

// rowsum(dO * O) of one row of `head` (0 where !inside), in every lane of the row's group: the
// group is this thread's run of softmax_d_lanes(kHeadDim) lanes, each reading one chunk. Every
// lane of the warp must call it.
template <class Element, int kHeadDim>
__device__ __forceinline__ float softmax_d_row(BwdParams const& p, DenseSeqs const& seq, int head,
                                               int row, bool inside) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kLanes = softmax_d_lanes(kHeadDim);
  static_assert(kHeadDim % 8 == 0 && kLanes <= 32);
  const int chunk = int(threadIdx.x) % kLanes;
  float sum = 0.f;
  if (inside && chunk < kChunks) {
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
  // Xor offsets below kLanes stay inside the group.
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffff, sum, offset);
  }
  return sum;
}

}  // namespace flashgen
