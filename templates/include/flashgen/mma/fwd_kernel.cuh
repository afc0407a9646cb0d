// The forward attention kernel (FlashAttention-2 design on mma.sync): one thread block per
// (batch, head, block of block_m query rows). The Q tile stays in shared memory; K and V tiles
// stream through a ring of kv_stages cp.async buffers, newest-to-oldest so that the tiles that
// need masking come first; S = Q K^T and O += P V run on mma.m16n8k16 with fp32 accumulators.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/mma/accumulator.cuh"
#include "flashgen/common/block_order.cuh"
#include "flashgen/mma/copy.cuh"
#include "flashgen/mma/fwd_traits.cuh"
#include "flashgen/mma/gemm.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/mma/softmax.cuh"
#include "flashgen/common/dropout.cuh"

namespace flashgen {

using namespace cute;

// Mask: a policy of common/mask.cuh; Seqs: where the sequences are (common/seqinfo.cuh);
// ScoreMod: common/score_mod.cuh; Dropout: common/dropout.cuh.
template <class Traits, class Mask, class Seqs = DenseSeqs, class ScoreMod = IdentityScore,
          class Dropout = NoDropout>
__global__ void __launch_bounds__(Traits::kThreads) fwd_kernel(const FwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimPadded = Traits::kHeadDimPadded;
  constexpr int kKvStages = Traits::kKvStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDimPadded>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDimPadded>>;

  extern __shared__ char smem[];
  const int tid = threadIdx.x;

  // A 1-D grid (no 65535 limit on batch * heads) in the order block_order.cuh describes. The
  // last query block ranks first: under causal masking it has the most work. A variable-length
  // batch's grid may be its own query blocks instead, each sequence's last first
  // (PackedQueryBlocks::use_tiles).
  QueryTile tile;
  if (PackedQueryBlocks<kBlockM>::use_tiles(p)) {
    tile = PackedQueryBlocks<kBlockM>::tile(p, int(blockIdx.x), true);
  } else {
    const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const BlockWork work = block_work(int(blockIdx.x), num_m_blocks, p.batch * p.heads,
                                      p.ranks_per_round);
    tile = {num_m_blocks - 1 - work.rank, work.batch_head % p.heads, work.batch_head / p.heads};
  }
  const int m_block = tile.m_block;
  const int head = tile.head;
  const int head_kv = head / (p.heads / p.heads_kv);
  const Seqs seq(p, tile.batch);
  const Mask mask = Mask(p, seq.batch, seq.seqlen_k, seq.mask_offset).for_head(head);
  const ScoreMod score_mod(p, seq.batch, head, seq.mask_offset);
  const Dropout dropout(p, seq.batch, head);

  // Key blocks this query block needs: those the mask lets its rows see. None (rows that see no
  // key) still runs the epilogue: O = 0, lse = -inf.
  const int rows_in_block = min(kBlockM, seq.seqlen_q - m_block * kBlockM);
  if (rows_in_block <= 0) return;  // past a shorter sequence of a variable-length batch
  const int n_block_max =
      mask.template key_block_end<kBlockN>(m_block * kBlockM + rows_in_block - 1);
  const int n_block_min = mask.template key_block_begin<kBlockN>(m_block * kBlockM);

  // Global memory, (rows, head_dim) for this sequence and head.
  Tensor mQ = seq.template q_rows<const Element, kHeadDim>(p.q, p.q_batch_stride, p.q_row_stride,
                                                           p.q_head_stride, head);
  Tensor mK = seq.template k_rows<const Element, kHeadDim>(p.k, p.k_batch_stride, p.k_row_stride,
                                                           p.k_head_stride, head_kv);
  Tensor mV = seq.template k_rows<const Element, kHeadDim>(p.v, p.v_batch_stride, p.v_row_stride,
                                                           p.v_head_stride, head_kv);
  Tensor mO = seq.template q_rows<Element, kHeadDim>(p.o, p.o_batch_stride, p.o_row_stride,
                                                     p.o_head_stride, head);
  Tensor gQ = local_tile(mQ, TileQ{}, make_coord(m_block, 0));   // (BLK_M, HDP)
  Tensor gO = local_tile(mO, TileQ{}, make_coord(m_block, 0));   // (BLK_M, HDP)
  Tensor gK = local_tile(mK, TileKV{}, make_coord(_, 0));        // (BLK_N, HDP, n_blocks)
  Tensor gV = local_tile(mV, TileKV{}, make_coord(_, 0));        // (BLK_N, HDP, n_blocks)

  // Shared memory: Q, then the K ring, then the V ring.
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                  // (BLK_M, HDP)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (BLK_N, HDP, S)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (BLK_N, HDP, S)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});          // (HDP, BLK_N, S)
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});           // (BLK_M, HDP)

  // Global -> shared partitions, with each element's (row, col) for predication.
  typename Traits::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr.partition_S(gQ);  // (CPY, CPY_M, CPY_K)
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_K, n_blocks)
  Tensor tKsK = gmem_thr.partition_D(sK);  // (CPY, CPY_N, CPY_K, S)
  Tensor tVgV = gmem_thr.partition_S(gV);
  Tensor tVsV = gmem_thr.partition_D(sV);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));     // (CPY, CPY_M, CPY_K)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));  // (CPY, CPY_N, CPY_K)

  auto load_kv = [&](int n_block, int stage) {
    const int rows = seq.seqlen_k - n_block * kBlockN;
    copy_tile<true, kHeadDim>(gmem_copy, tKgK(_, _, _, n_block), tKsK(_, _, _, stage), tKVcKV, rows);
    copy_tile<true, kHeadDim>(gmem_copy, tVgV(_, _, _, n_block), tVsV(_, _, _, stage), tKVcKV, rows);
  };

  // MMA partitions and register fragments.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);                 // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK(_, _, 0));        // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVt(_, _, 0));      // (MMA, MMA_K, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});       // (MMA, MMA_M, MMA_K)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  clear(acc_o);

  // Shared -> register copies (ldmatrix), laid out to match the MMA fragments.
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSsQ = smem_copy_q.get_thread_slice(tid).partition_S(sQ);    // (CPY, CPY_M, CPY_K)
  Tensor tSsK = smem_copy_k.get_thread_slice(tid).partition_S(sK);    // (CPY, CPY_N, CPY_K, S)
  Tensor tOsVt = smem_copy_v.get_thread_slice(tid).partition_S(sVt);  // (CPY, CPY_K, CPY_N, S)

  // Prologue: Q, then kv_stages - 1 key/value tiles in flight, one commit group per tile (Q
  // rides with the first). Empty groups keep the count uniform for cp_async_wait below.
  copy_tile<true, kHeadDim>(gmem_copy, tQgQ, tQsQ, tQcQ, rows_in_block);
  // The key blocks the tile visits, newest first: the next to compute and the next to load
  // (kv_stages - 1 ahead), each stepping below() down to n_first.
  const int2 visited = visited_key_blocks<kBlockM, kBlockN>(mask, m_block, n_block_min,
                                                            n_block_max);
  const int n_first = visited.x;
  auto below = [&](int n_block) {
    return key_block_below<kBlockM, kBlockN>(mask, m_block, n_block, n_first);
  };
  int n_next = visited.y;
  int n_load = visited.y;
  CUTE_UNROLL
  for (int stage = 0; stage < kKvStages - 1; ++stage) {
    if (n_load >= n_first) {
      load_kv(n_load, stage);
      n_load = below(n_load);
    }
    cp_async_fence();
  }

  OnlineSoftmax<decltype(size<0>(rowcol_layout(acc_o.layout())))::value> softmax;
  // This warp's last query row in the block: on a tile by the causal diagonal whose first key
  // comes after it, the whole warp sees no key (its P would be all zero) and skips the tile.
  const int warp_last_row = __reduce_max_sync(0xffffffff, last_row(tScS));
  int smem_pipe_read = 0;
  int smem_pipe_write = kKvStages - 1;

  // One key/value tile: S = Q K^T, the online softmax, O += P V. With kMask false (a
  // compile-time constant) the tile carries no masking code.
  auto step = [&](auto masked) {
    constexpr bool kMask = decltype(masked)::value;
    const int n_block = n_next;
    n_next = below(n_next);
    cp_async_wait<kKvStages - 2>();
    __syncthreads();
    // Every warp is past the previous tile, so its buffer can take the tile kv_stages - 1 ahead.
    // That tile lies below the last one, so all of its rows exist: no row predicates.
    if (n_load >= n_first) {
      copy_all_rows<true, kHeadDim, kHeadDimPadded>(gmem_copy, tKgK(_, _, _, n_load),
                                                    tKsK(_, _, _, smem_pipe_write), tKVcKV);
      copy_all_rows<true, kHeadDim, kHeadDimPadded>(gmem_copy, tVgV(_, _, _, n_load),
                                                    tVsV(_, _, _, smem_pipe_write), tKVcKV);
      n_load = below(n_load);
    }
    cp_async_fence();

    const bool warp_sees_keys =
        !(kMask && Mask::kHidesKeys) ||
        mask.sees_from(m_block * kBlockM + warp_last_row, n_block * kBlockN);
    if (warp_sees_keys) {
      // S = Q K^T
      Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK(_, _, _, smem_pipe_read), smem_copy_q,
              smem_copy_k);
      apply_score_mod(score_mod, acc_s, tScS, m_block * kBlockM, n_block * kBlockN);
      if (kMask && mask.template tile_needs_mask<kBlockM, kBlockN>(m_block, n_block)) {
        apply_mask(mask, acc_s, tScS, m_block * kBlockM, n_block * kBlockN);
      }
      softmax.update(acc_s, acc_o, p.scale_log2);
      if constexpr (Dropout::kEnabled) {  // after the row sums, which count every element
        Tensor probs = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));
        Tensor coords = make_tensor(tScS.data(), rowcol_layout(tScS.layout()));
        for_each_dropout_decision(dropout, coords, m_block * kBlockM, n_block * kBlockN,
                                  [&](int r, int c, bool keep) {
                                    probs(r, c) = keep ? probs(r, c) : 0.f;
                                  });
      }

      gemm_pv<Element>(tiled_mma, acc_o, acc_s, tOrVt, tOsVt(_, _, _, smem_pipe_read),
                       smem_copy_v);
    }

    smem_pipe_write = smem_pipe_read;
    smem_pipe_read = smem_pipe_read + 1 == kKvStages ? 0 : smem_pipe_read + 1;
  };

  if constexpr (Traits::kSeparateMaskedLoop) {
    // Newest to oldest, the tiles that straddle seqlen_k or the diagonal all come first and those
    // that straddle a window's left edge last.
    auto needs_mask = [&](int n_block) {
      return mask.template tile_needs_mask<kBlockM, kBlockN>(m_block, n_block);
    };
    CUTE_NO_UNROLL
    while (n_next >= n_first && needs_mask(n_next)) step(cute::true_type{});
    CUTE_NO_UNROLL
    while (n_next >= n_first && !needs_mask(n_next)) step(cute::false_type{});
    CUTE_NO_UNROLL
    while (n_next >= n_first) step(cute::true_type{});
  } else {
    CUTE_NO_UNROLL
    while (n_next >= n_first) step(cute::true_type{});
  }
  // Every thread's copies have landed before O overwrites Q's shared memory. The loop's barrier
  // does not cover a block that ran no tile (rows that see no key): without this one, another
  // thread's Q copy could land on top of the staged output.
  cp_async_wait<0>();
  __syncthreads();

  // Epilogue: normalise, write lse per row, stage O through shared memory and store it with
  // 16-byte coalesced writes.
  const float sink = sink_log2(p, head);
  softmax.finalize(acc_o, p.scale_log2, [&](int) { return sink; });
  if constexpr (Dropout::kEnabled) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= dropout.scale;
  }

  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(TileQ{}));  // (MMA, MMA_M, MMA_K)
  Tensor row_coords = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));
  if (tid % 4 == 0) {
    float* lse_ptr = p.softmax_lse + seq.row_stats_offset(p.heads, head);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(row_coords); ++r) {
      const int row = m_block * kBlockM + get<0>(row_coords(r, 0));
      if (row < seq.seqlen_q) lse_ptr[row] = softmax.row_max[r];
    }
  }

  Tensor o_regs = make_tensor_like<Element>(acc_o);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); ++i) o_regs(i) = Element(acc_o(i));
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto thr_copy_o = smem_copy_o.get_thread_slice(tid);
  copy(smem_copy_o, thr_copy_o.retile_S(o_regs), thr_copy_o.partition_D(sO));
  __syncthreads();

  typename Traits::GmemTiledCopyO gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(tid);
  copy_tile<false, kHeadDim>(gmem_copy_o, gmem_thr_o.partition_S(sO), gmem_thr_o.partition_D(gO),
                             gmem_thr_o.partition_S(make_identity_tensor(TileQ{})), rows_in_block);
#endif
}

}  // namespace flashgen
