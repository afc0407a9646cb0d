// Where one sequence's rows are: the one place kernels turn (batch, head) into memory offsets and
// lengths. DenseSeqs is a batch of equal-length sequences, each tensor (batch, seq, heads, dim)
// with any strides, or (cu_seqlens_q set) a variable-length batch packed into (1, total rows,
// heads, dim) tensors: a run-time branch per block, so one kernel serves both. A further layout is
// a further type with these members, taken by the kernels as a template parameter.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>

namespace flashgen {

// A variable-length batch's query blocks of kBlockM rows, per head, as FlashAttention-3's varlen
// layout: sequence b's from block (its first row + b x kBlockM) / kBlockM, which leaves room for
// its blocks before the next sequence's, so that a head of `rows` packed rows takes (rows + batch
// x kBlockM) / kBlockM blocks whatever the lengths. After a sequence's blocks there may be one
// that holds none of its rows (a gap; and past the last sequence, the packed tensors' spare
// rows). Grids over these blocks launch none for the rows a dense batch of the longest would
// pad each sequence to.
// A forward's tile: one query block of one (sequence, head).
struct QueryTile {
  int m_block, head, batch;
};

template <int kBlockM>
struct PackedQueryBlocks {
  __host__ __device__ __forceinline__ static int64_t per_head(int64_t rows, int batch) {
    return (rows + int64_t(batch) * kBlockM) / kBlockM;
  }
  // Sequence b's first block, given its first row.
  __host__ __device__ __forceinline__ static int first(int64_t first_row, int b) {
    return int((first_row + int64_t(b) * kBlockM) / kBlockM);
  }
  // The sequence whose blocks (or gap) hold block `block`: the last whose first block is at most
  // it (the first blocks increase with the sequence), by a binary search of cu_seqlens_q.
  __device__ __forceinline__ static int sequence(const int* cu_seqlens_q, int batch, int block) {
    int low = 0, high = batch - 1;
    while (low < high) {
      const int mid = (low + high + 1) / 2;
      if (first(cu_seqlens_q[mid], mid) <= block) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    return low;
  }

  // A forward's tiles over a variable-length batch (cu_seqlens_q set) are those of a dense batch
  // of the longest lengths, or, where they are fewer (use_tiles), each sequence's blocks here
  // for each head in turn: a grid of those launches no tile past a shorter sequence's rows, but
  // equal lengths, whose dense tiles have none, would run a gap's tile per sequence and head.
  template <class Params>
  __host__ __device__ __forceinline__ static int64_t tiles(Params const& p) {
    return per_head(p.q_view_rows, p.batch) * p.heads;
  }
  template <class Params>
  __host__ __device__ __forceinline__ static bool use_tiles(Params const& p) {
    return p.cu_seqlens_q != nullptr &&
           tiles(p) < (int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM * p.batch * p.heads;
  }
  // Tile `index` of those, its sequence's blocks last first where longest_first. A gap's m_block
  // is past its sequence's rows.
  template <class Params>
  __device__ __forceinline__ static QueryTile tile(Params const& p, int index,
                                                   bool longest_first) {
    const int batch = sequence(p.cu_seqlens_q, p.batch, index / p.heads);
    const int first_row = p.cu_seqlens_q[batch];
    const int first_block = first(first_row, batch);
    const int blocks = (batch + 1 < p.batch ? first(p.cu_seqlens_q[batch + 1], batch + 1)
                                            : int(per_head(p.q_view_rows, p.batch))) -
                       first_block;  // the sequence's, and a gap
    const int own = index - first_block * p.heads;
    const int m = own % blocks;
    const int m_blocks = (p.cu_seqlens_q[batch + 1] - first_row + kBlockM - 1) / kBlockM;
    return {longest_first && m < m_blocks ? m_blocks - 1 - m : m, own / blocks, batch};
  }
};

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
      k_start = p.cu_seqlens_k[batch];
      seqlen_q = p.cu_seqlens_q[batch + 1] - int(q_start);
      seqlen_k = p.cu_seqlens_k[batch + 1] - int(k_start);
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
