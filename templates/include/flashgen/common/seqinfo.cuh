// Where one sequence's rows are: the one place kernels turn (batch, head) into memory offsets and
// lengths. DenseSeqs is a batch of equal-length sequences, each tensor (batch, seq, heads, dim)
// with any strides, or (cu_seqlens_q set) a variable-length batch packed into (1, total rows,
// heads, dim) tensors: a run-time branch per block, so one kernel serves both. A further layout is
// a further type with these members, taken by the kernels as a template parameter.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>

namespace flashgen {

struct DenseSeqs {
  int batch;     // this sequence's index in the batch
  int seqlen_q;  // its query rows
  int seqlen_k;  // its key rows
  int mask_offset;
  bool packed;          // a variable-length batch: rows from q_start and k_start
  int64_t q_start = 0;  // its first row in the packed tensors
  int64_t k_start = 0;
  int64_t stats_start;  // its first row in a head's per-row statistics
  int64_t stats_rows;   // rows per head there

  // A variable-length batch (cu_seqlens_q set) reads its lengths from the device; each
  // sequence's causal mask then aligns bottom-right, as FlashAttention's varlen functions do.
  // Its keys are a packed run per sequence (cu_seqlens_k, of which seqused_k may use the first
  // keys), or without cu_seqlens_k a KV cache, whose layout (kv_cache.cuh) sets the lengths.
  template <class Params>
  __device__ __forceinline__ DenseSeqs(Params const& p, int batch)
      : batch(batch), packed(p.cu_seqlens_q != nullptr) {
    if (!packed) {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
      mask_offset = p.mask_offset;
      stats_start = int64_t(batch) * p.heads * p.seqlen_q;
      stats_rows = p.seqlen_q;
    } else {
      q_start = p.cu_seqlens_q[batch];
      seqlen_q = p.cu_seqlens_q[batch + 1] - int(q_start);
      if (p.cu_seqlens_k != nullptr) {
        k_start = p.cu_seqlens_k[batch];
        seqlen_k = p.cu_seqlens_k[batch + 1] - int(k_start);
        if (p.seqused_k != nullptr) seqlen_k = max(0, min(seqlen_k, p.seqused_k[batch]));
      } else {
        seqlen_k = p.seqlen_k;
      }
      mask_offset = seqlen_k - seqlen_q;
      stats_start = q_start;
      stats_rows = p.cu_seqlens_q[p.batch];
    }
  }

  // Every row of a variable-length batch as one sequence, from packed row 0 (the sequences' rows
  // in turn): for per-row helpers that need no sequence's bounds, so that their grids run over
  // the packed rows rather than a dense batch of the longest.
  struct AllRows {};
  template <class Params>
  __device__ __forceinline__ DenseSeqs(Params const& p, AllRows)
      : batch(0), packed(true), stats_start(0) {
    seqlen_q = p.cu_seqlens_q[p.batch];
    seqlen_k = p.cu_seqlens_k[p.batch];
    mask_offset = 0;
    stats_rows = seqlen_q;
  }

  // The (seqlen_q, kHeadDim) rows of one head of a query-side tensor (q, o, dout, dq) and the
  // (seqlen_k, kHeadDim) rows of a key-side one (k, v, dk, dv), given its base pointer and its
  // (batch, row, head) strides in elements. Element may be const.
  template <class Element, int kHeadDim, class Pointer>
  __device__ __forceinline__ auto q_rows(Pointer base, int64_t batch_stride, int64_t row_stride,
                                         int64_t head_stride, int head) const {
    return rows<Element, kHeadDim>(base, q_offset(batch_stride, row_stride, head_stride, head),
                                   seqlen_q, row_stride);
  }
  template <class Element, int kHeadDim, class Pointer>
  __device__ __forceinline__ auto k_rows(Pointer base, int64_t batch_stride, int64_t row_stride,
                                         int64_t head_stride, int head_kv) const {
    return rows<Element, kHeadDim>(base, k_offset(batch_stride, row_stride, head_stride, head_kv),
                                   seqlen_k, row_stride);
  }
  // Offsets in elements of the first row of one head, query side and key side.
  __device__ __forceinline__ int64_t q_offset(int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride, int head) const {
    return (packed ? q_start * row_stride : batch * batch_stride) + head * head_stride;
  }
  __device__ __forceinline__ int64_t k_offset(int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride, int head_kv) const {
    return (packed ? k_start * row_stride : batch * batch_stride) + head_kv * head_stride;
  }
  // Offset of (this sequence, head)'s first row in a per-row statistic (lse, D, the dQ workspace
  // in rows): (batch, heads, seqlen_q) contiguous, or (heads, total rows) for a variable-length
  // batch.
  __device__ __forceinline__ int64_t row_stats_offset(int heads, int head) const {
    return stats_start + head * stats_rows;
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
