// A variable-length batch's query blocks, packed per head (FlashAttention-3's varlen layout),
// and a forward's (or the decode kernel's) tiles over them: where each sequence's blocks are, and
// which sequence a block falls to. Host too, so that a CPU test can check them (tests/test_packed_blocks.py).
#pragma once

#include <cstdint>

namespace flashgen {

// The last sequence b of a batch's whose start is at or before a place (starts_at_most(b); the
// starts increase with b), by a binary search: where an empty sequence shares its start with the
// next, the next.
template <class StartsAtMost>
__host__ __device__ __forceinline__ int last_sequence(int batch, StartsAtMost starts_at_most) {
  int low = 0, high = batch - 1;
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (starts_at_most(mid)) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

// The sequence that packed row `row` (below cu_seqlens_q[batch]) belongs to.
__host__ __device__ __forceinline__ int sequence_of_row(const int* cu_seqlens_q, int batch,
                                                        int row) {
  return last_sequence(batch, [=](int b) { return cu_seqlens_q[b] <= row; });
}

// A forward's tile: one query block of one (sequence, head).
struct QueryTile {
  int m_block, head, batch;
};

// A variable-length batch's query blocks of kBlockM rows, per head, as FlashAttention-3's varlen
// layout: sequence b's from block (its first row + b x kBlockM) / kBlockM, which leaves room for
// its blocks before the next sequence's, so that a head of `rows` packed rows takes (rows + batch
// x kBlockM) / kBlockM blocks whatever the lengths. After a sequence's blocks there may be one
// that holds none of its rows (a gap; and past the last sequence, the packed tensors' spare
// rows). Grids over these blocks launch none for the rows a dense batch of the longest would
// pad each sequence to.
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
  // it (the first blocks increase with the sequence), by a binary search of cu_seqlens_q. A
  // token may be several packed rows (the decode kernel's, one per query head of a KV head).
  __host__ __device__ __forceinline__ static int sequence(const int* cu_seqlens_q, int batch,
                                                          int block, int rows_per_token = 1) {
    return last_sequence(batch, [=](int b) {
      return first(int64_t(cu_seqlens_q[b]) * rows_per_token, b) <= block;
    });
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
  __host__ __device__ __forceinline__ static int64_t dense_tiles(Params const& p) {
    return (int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM * p.batch * p.heads;
  }
  template <class Params>
  __host__ __device__ __forceinline__ static bool use_tiles(Params const& p) {
    return p.cu_seqlens_q != nullptr && tiles(p) < dense_tiles(p);
  }
  // The forward's grid: the fewer of the two (none where the batch or its longest sequence is
  // empty, since packed tiles must then be fewer).
  template <class Params>
  __host__ __device__ __forceinline__ static int64_t grid_tiles(Params const& p) {
    return use_tiles(p) ? tiles(p) : dense_tiles(p);
  }
  // Tile `index` of those, its sequence's blocks last first where longest_first. A gap's m_block
  // is past its sequence's rows.
  template <class Params>
  __host__ __device__ __forceinline__ static QueryTile tile(Params const& p, int index,
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

// The decode kernel's blocks of kBlockM packed rows (token x group + query head within the
// group, group = heads / heads_kv) per KV head: grid x the query blocks, y the splits, z the KV
// heads (of each sequence, for a dense batch). A dense batch has ceil(seqlen_q x group / kBlockM)
// blocks per sequence; a variable-length one takes PackedQueryBlocks' layout of its packed rows
// (q_view_rows of them) where that has fewer, so that the short sequences of a mixed batch (and,
// in its other launch, the long one) launch no blocks for the rows the longest would pad them to.
template <int kBlockM>
struct DecodeBlocks {
  using Packed = PackedQueryBlocks<kBlockM>;

  template <class Params>
  __host__ __device__ __forceinline__ static int64_t dense_per_head(Params const& p) {
    return int64_t(p.batch) *
           ((int64_t(p.seqlen_q) * (p.heads / p.heads_kv) + kBlockM - 1) / kBlockM);
  }
  template <class Params>
  __host__ __device__ __forceinline__ static int64_t packed_per_head(Params const& p) {
    return Packed::per_head(int64_t(p.q_view_rows) * (p.heads / p.heads_kv), p.batch);
  }
  template <class Params>
  __host__ __device__ __forceinline__ static bool packed(Params const& p) {
    return p.cu_seqlens_q != nullptr && packed_per_head(p) < dense_per_head(p);
  }
  // The grid's x and z; y is the split count.
  template <class Params>
  __host__ __device__ __forceinline__ static int64_t grid_x(Params const& p) {
    return packed(p) ? packed_per_head(p) : dense_per_head(p) / p.batch;
  }
  template <class Params>
  __host__ __device__ __forceinline__ static int64_t grid_z(Params const& p) {
    return packed(p) ? p.heads_kv : int64_t(p.batch) * p.heads_kv;
  }
  // Block (x, z)'s query block, KV head (as `head`) and sequence; a gap's m_block is past its
  // sequence's rows.
  template <class Params>
  __host__ __device__ __forceinline__ static QueryTile block(Params const& p, int x, int z) {
    if (!packed(p)) return {x, z % p.heads_kv, z / p.heads_kv};
    const int group = p.heads / p.heads_kv;
    const int batch = Packed::sequence(p.cu_seqlens_q, p.batch, x, group);
    return {x - Packed::first(int64_t(p.cu_seqlens_q[batch]) * group, batch), z, batch};
  }
};

}  // namespace flashgen
