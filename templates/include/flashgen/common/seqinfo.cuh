// Where one sequence's rows are: the one place kernels turn (batch, head) into memory offsets and
// lengths. DenseSeqs is a batch of equal-length sequences, each tensor (batch, seq, heads, dim)
// with any strides. Variable-length batches (cu_seqlens) and paged KV caches are further types with
// these members, taken by the kernels as a template parameter.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>

namespace flashgen {

struct DenseSeqs {
  int batch;     // this sequence's index in the batch
  int seqlen_q;  // its query rows
  int seqlen_k;  // its key rows
  int mask_offset;

  template <class Params>
  __device__ __forceinline__ DenseSeqs(Params const& p, int batch)
      : batch(batch), seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k), mask_offset(p.mask_offset) {}

  // The (seqlen_q, kHeadDim) rows of one head of a query-side tensor (q, o, dout, dq) and the
  // (seqlen_k, kHeadDim) rows of a key-side one (k, v, dk, dv), given its base pointer and its
  // (batch, row, head) strides in elements. Element may be const.
  template <class Element, int kHeadDim, class Pointer>
  __device__ __forceinline__ auto q_rows(Pointer base, int64_t batch_stride, int64_t row_stride,
                                         int64_t head_stride, int head) const {
    return rows<Element, kHeadDim>(base, q_offset(batch_stride, head_stride, head), seqlen_q,
                                   row_stride);
  }
  template <class Element, int kHeadDim, class Pointer>
  __device__ __forceinline__ auto k_rows(Pointer base, int64_t batch_stride, int64_t row_stride,
                                         int64_t head_stride, int head_kv) const {
    return rows<Element, kHeadDim>(base, k_offset(batch_stride, head_stride, head_kv), seqlen_k,
                                   row_stride);
  }
  // Offsets in elements of the first row of one head, query side and key side.
  __device__ __forceinline__ int64_t q_offset(int64_t batch_stride, int64_t head_stride,
                                              int head) const {
    return batch * batch_stride + head * head_stride;
  }
  __device__ __forceinline__ int64_t k_offset(int64_t batch_stride, int64_t head_stride,
                                              int head_kv) const {
    return batch * batch_stride + head_kv * head_stride;
  }
  // Offset of (this sequence, head)'s first row in a per-row statistic (lse, D, the dQ workspace
  // in rows): (batch, heads, seqlen_q), contiguous.
  __device__ __forceinline__ int64_t row_stats_offset(int heads, int head) const {
    return (int64_t(batch) * heads + head) * seqlen_q;
  }

 private:
  template <class Element, int kHeadDim, class Pointer>
  __device__ __forceinline__ static auto rows(Pointer base, int64_t offset, int rows,
                                              int64_t row_stride) {
    using namespace cute;
    auto* ptr = static_cast<Element*>(base) + offset;
    return make_tensor(make_gmem_ptr(ptr), make_shape(rows, Int<kHeadDim>{}),
                       make_stride(row_stride, _1{}));
  }
};

}  // namespace flashgen
