// Attention over a KV cache (flash-decoding) on mma.sync: one thread block per (block of packed
// query rows, split of the keys, sequence and KV head).
//
// The query heads that share a KV head and the new tokens form the M rows of one tile (packed row r
// = token * group + head within the group), so each K/V byte crosses the bus once per tile however
// many query heads read it. The warps split a tile's rows, or, over a paged cache where a step's
// rows fit one warp's 16 (kKeysAcrossWarps: one token of a GQA group), its keys: each warp then
// runs flash-decoding over its share of every key block, and the block combines the warps'
// partial results in shared memory before it writes (or leaves a split's partials). The keys, up to
// the last one the tile's rows see, are cut into num_splits equal runs of key blocks, one per
// block: a batch of one short sequence still fills the GPU. Each key row's address comes from the
// cache layout (KvCacheRows): a contiguous cache, or a paged one of any page size. The queries are
// a dense batch, or a variable-length one packed (cu_seqlens_q, flash_attn_varlen_func over a paged
// cache): the grid then covers the sequences' packed query blocks (DecodeBlocks); a batch mixing
// prefill and decode runs as two launches, each attending for the sequences of its query counts.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/common/kv_cache.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/common/split_combine.cuh"
#include "flashgen/mma/accumulator.cuh"
#include "flashgen/mma/fwd_traits.cuh"
#include "flashgen/mma/gemm.cuh"
#include "flashgen/mma/softmax.cuh"

namespace flashgen {

using namespace cute;

// 16 bytes global -> shared, or 16 zero bytes when !valid (src is then not read).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0));
}

// Mask: a policy of common/mask.cuh, applied to each packed row's token. ScoreMod: of
// common/score_mod.cuh, the kinds whose codegen/score_mods.py entry lists decode; one that reads
// the head is constructed per packed row (a tile's rows belong to every head of the group).
template <class Traits, class Mask, class ScoreMod, bool kKeysAcrossWarps>
__global__ void __launch_bounds__(Traits::kThreads) decode_kernel(const DecodeParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  constexpr int kWarps = Traits::kWarps;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimPadded = Traits::kHeadDimPadded;
  constexpr int kKvStages = Traits::kKvStages;
  constexpr int kRowsPerWarp = kBlockM / kWarps;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDimPadded>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDimPadded>>;
  // What one warp's mma covers: (rows, keys) of its score tile.
  constexpr int kMmaRows = kKeysAcrossWarps ? 16 : kBlockM;
  constexpr int kMmaKeys = kKeysAcrossWarps ? kBlockN / kWarps : kBlockN;
  static_assert(!kKeysAcrossWarps || kMmaKeys % 16 == 0, "a warp's keys: whole 16-key steps");
  using TileS = Shape<Int<kMmaRows>, Int<kMmaKeys>>;
  using TileO = Shape<Int<kMmaRows>, Int<kHeadDimPadded>>;

  extern __shared__ char smem[];
  const int tid = threadIdx.x;
  const QueryTile block = DecodeBlocks<kBlockM>::block(p, int(blockIdx.x), int(blockIdx.z));
  const int m_block = block.m_block;
  const int batch = block.batch;
  const int head_kv = block.head;
  const int split = blockIdx.y;
  const int group = p.heads / p.heads_kv;
  const DenseSeqs seq(p, batch);  // the sequence's queries (its keys are the cache's)
  // A mixed batch's other launch attends for this sequence (DecodeParams::min_seqlen_q).
  if (seq.seqlen_q < p.min_seqlen_q || seq.seqlen_q > p.seqlen_q) return;
  const int packed_rows = seq.seqlen_q * group;
  const int row0 = m_block * kBlockM;  // this block's first packed row
  if (row0 >= packed_rows) return;     // past a shorter sequence of a variable-length batch

  const KvCacheRows cache(p, batch, head_kv);
  // The new tokens are the last seqlen_q keys' queries: the causal mask aligns bottom-right.
  const int offset = cache.seqlen_k - seq.seqlen_q;
  const Mask mask(p, batch, cache.seqlen_k, offset);
  // The modifier of a packed row: its own head's where the modifier reads one (ALiBi's slope).
  const ScoreMod score_mod(p, batch, head_kv * group, offset);
  auto row_modifier = [&](int packed_row) {
    if constexpr (ScoreMod::kReadsHead) {
      return ScoreMod(p, batch, head_kv * group + packed_row % group, offset);
    } else {
      return score_mod;
    }
  };
  const int first_token = row0 / group;
  const int last_token = (min(packed_rows, row0 + kBlockM) - 1) / group;

  // This split's key blocks: an equal share of those the block's tokens see, newest first.
  const int n_end = mask.template key_block_end<kBlockN>(last_token);
  const int n_first = min(n_end, mask.template key_block_begin<kBlockN>(first_token));
  const int per_split = (n_end - n_first + p.num_splits - 1) / p.num_splits;
  const int n_begin = min(n_end, n_first + split * per_split);
  const int n_stop = min(n_end, n_begin + per_split);
  const int n_tiles = n_stop - n_begin;

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                  // (BLK_M, HDP)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (BLK_N, HDP, S)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});          // (HDP, BLK_N, S)
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});           // (BLK_M, HDP)

  // Each thread's 16-byte chunks of a tile and their (row, col), for the per-row addresses.
  typename Traits::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQsQ = gmem_thr.partition_D(sQ);                                  // (CPY, CPY_M, CPY_K)
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKsK = gmem_thr.partition_D(sK);                                  // (CPY, CPY_N, CPY_K, S)
  Tensor tVsV = gmem_thr.partition_D(sV);
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));    // (CPY, CPY_N, CPY_K)

  // Q: packed row -> (token, head); rows past the last are zero.
  const Element* q =
      static_cast<const Element*>(p.q) + seq.q_offset(p.q_batch_stride, p.q_row_stride, 0, 0);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tQsQ); ++m) {
    const int row = row0 + get<0>(tQcQ(0, m, 0));
    const bool row_ok = row < packed_rows;
    const Element* src =
        q + (row / group) * p.q_row_stride + (head_kv * group + row % group) * p.q_head_stride;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tQsQ); ++k) {
      const int col = get<1>(tQcQ(0, m, k));
      const bool ok = row_ok && col < kHeadDim;
      cp_async_16(&tQsQ(0, m, k), ok ? src + col : q, ok);
    }
  }

  // The pages of this thread's rows of the next key block to load. A paged cache's block-table
  // reads run a loop step ahead of the copies whose addresses they give (locate, then load_kv),
  // so neither the copies nor the compute between them wait on the table.
  constexpr int kRowsPerThread = decltype(size<1>(tKsK))::value;
  int pages_at[kRowsPerThread];
  auto key_of = [&](int n_block, int m) { return n_block * kBlockN + get<0>(tKVcKV(0, m, 0)); };
  auto locate = [&](int n_block) {
    CUTE_UNROLL
    for (int m = 0; m < kRowsPerThread; ++m) {
      const int key = key_of(n_block, m);
      pages_at[m] = key < cache.seqlen_k ? cache.page_of(cache.first + key) : 0;
    }
  };
  const Element* k_cache = static_cast<const Element*>(p.k);
  const Element* v_cache = static_cast<const Element*>(p.v);
  auto load_kv = [&](int stage, int n_block) {
    CUTE_UNROLL
    for (int m = 0; m < kRowsPerThread; ++m) {
      const int key = key_of(n_block, m);
      const bool row_ok = key < cache.seqlen_k;
      const KvCacheRows::Offsets at = cache.offsets(cache.first + key, pages_at[m]);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tKsK); ++k) {
        const int col = get<1>(tKVcKV(0, m, k));
        const bool ok = row_ok && col < kHeadDim;
        cp_async_16(&tKsK(0, m, k, stage), k_cache + (ok ? at.k + col : 0), ok);
        cp_async_16(&tVsV(0, m, k, stage), v_cache + (ok ? at.v + col : 0), ok);
      }
    }
  };

  // The warps' mma: the rows split over them (each warp its kRowsPerWarp), or one warp's 16 rows
  // over the warp's own kMmaKeys keys of each K and V stage.
  const int warp = tid / 32;
  auto tiled_mma = [] {
    if constexpr (kKeysAcrossWarps) {
      return WarpGridMma<Element, 1, 1>{};
    } else {
      return typename Traits::TiledMma{};
    }
  }();
  const int mma_thread = kKeysAcrossWarps ? tid % 32 : tid;
  auto mma_view = [&](auto& tile, auto shape, auto coord) {
    if constexpr (kKeysAcrossWarps) {
      return local_tile(tile, shape, coord);
    } else {
      return tile;
    }
  };
  Tensor sQm = mma_view(sQ, TileO{}, make_coord(0, 0));
  Tensor sKm = mma_view(sK, Shape<Int<kMmaKeys>, Int<kHeadDimPadded>, Int<kKvStages>>{},
                        make_coord(warp, 0, 0));
  Tensor sVtm = mma_view(sVt, Shape<Int<kHeadDimPadded>, Int<kMmaKeys>, Int<kKvStages>>{},
                         make_coord(0, warp, 0));
  // This warp's first key of a key block.
  const int mma_key0 = kKeysAcrossWarps ? warp * kMmaKeys : 0;

  auto thr_mma = tiled_mma.get_thread_slice(mma_thread);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQm);
  Tensor tSrK = thr_mma.partition_fragment_B(sKm(_, _, 0));
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtm(_, _, 0));
  Tensor acc_o = partition_fragment_C(tiled_mma, TileO{});
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(TileS{}));
  clear(acc_o);

  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSsQ = smem_copy_q.get_thread_slice(mma_thread).partition_S(sQm);
  Tensor tSsK = smem_copy_k.get_thread_slice(mma_thread).partition_S(sKm);
  Tensor tOsVt = smem_copy_v.get_thread_slice(mma_thread).partition_S(sVtm);

  // Q rides with the first tile's commit group; empty groups keep the count uniform.
  CUTE_UNROLL
  for (int stage = 0; stage < kKvStages - 1; ++stage) {
    if (stage < n_tiles) {
      locate(n_stop - 1 - stage);
      load_kv(stage, n_stop - 1 - stage);
    }
    cp_async_fence();
  }
  if (kKvStages - 1 < n_tiles) locate(n_stop - kKvStages);

  OnlineSoftmax<decltype(size<0>(rowcol_layout(acc_o.layout())))::value> softmax;
  // Warps whose rows all lie past the packed rows only help load; a warp whose last token
  // comes before its keys' first visible one skips them. Split keys: every warp has the rows.
  const int warp_row0 = kKeysAcrossWarps ? row0 : row0 + warp * kRowsPerWarp;
  const bool warp_has_rows = warp_row0 < packed_rows;
  const int warp_last_token =
      kKeysAcrossWarps ? last_token
                       : (min(packed_rows, warp_row0 + kRowsPerWarp) - 1) / group;
  int smem_pipe_read = 0;
  int smem_pipe_write = kKvStages - 1;

  CUTE_NO_UNROLL
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int n_block = n_stop - 1 - tile;
    cp_async_wait<kKvStages - 2>();
    __syncthreads();
    if (tile + kKvStages - 1 < n_tiles) {
      load_kv(smem_pipe_write, n_block - (kKvStages - 1));
      if (tile + kKvStages < n_tiles) locate(n_block - kKvStages);
    }
    cp_async_fence();

    const int key0 = n_block * kBlockN + mma_key0;  // the warp's first key of this block
    if (warp_has_rows && mask.sees_from(warp_last_token, key0)) {
      Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});
      clear(acc_s);
      gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK(_, _, _, smem_pipe_read), smem_copy_q,
              smem_copy_k);
      if constexpr (!ScoreMod::kIdentity) {
        Tensor scores = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));  // (rows, cols)
        Tensor coords = make_tensor(tScS.data(), rowcol_layout(tScS.layout()));
        CUTE_UNROLL
        for (int r = 0; r < size<0>(scores); ++r) {
          const int packed_row = row0 + get<0>(coords(r, 0));
          const ScoreMod row_score_mod = row_modifier(packed_row);
          CUTE_UNROLL
          for (int c = 0; c < size<1>(scores); ++c) {
            scores(r, c) = row_score_mod.apply(scores(r, c), packed_row / group,
                                               key0 + get<1>(coords(r, c)));
          }
        }
      }
      // A built-in mask's visible keys of a token are one run, which moves right with the
      // token: a tile whose last key the first token sees and whose first key the last token
      // sees needs no mask. A config-defined mask_mod may hide any key of any tile.
      if (kMasksEveryTile<Mask> || !mask.visible(first_token, key0 + kMmaKeys - 1) ||
          !mask.visible(last_token, key0)) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          const int packed_row = row0 + get<0>(tScS(i));
          const int key = key0 + get<1>(tScS(i));
          if (!mask.for_head(head_kv * group + packed_row % group).visible(packed_row / group,
                                                                            key)) {
            acc_s(i) = -INFINITY;
          }
        }
      }
      softmax.update(acc_s, acc_o, p.scale_log2);
      gemm_pv<Element>(tiled_mma, acc_o, acc_s, tOrVt, tOsVt(_, _, _, smem_pipe_read),
                       smem_copy_v);
    }
    smem_pipe_write = smem_pipe_read;
    smem_pipe_read = smem_pipe_read + 1 == kKvStages ? 0 : smem_pipe_read + 1;
  }
  cp_async_wait<0>();
  __syncthreads();

  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(TileO{}));
  Tensor coords = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));  // (rows, cols)
  // A split's partial results, and a warp's of split keys, leave the sinks to the combine, which
  // sees every part.
  softmax.finalize(acc_o, p.scale_log2, [&](int r) {
    return p.num_splits > 1 || kKeysAcrossWarps
               ? -INFINITY
               : sink_log2(p, head_kv * group + (row0 + get<0>(coords(r, 0))) % group);
  });
  // Row (token, head)'s index in the statistics: (batch, heads, seqlen_q), or (heads, total rows)
  // for a variable-length batch.
  auto stats_row = [&](int row) {
    return seq.row_stats_offset(p.heads, head_kv * group + row % group) + row / group;
  };
  const int rows_here = min(kBlockM, packed_rows - row0);

  if constexpr (kKeysAcrossWarps) {
    // Each warp's normalised partial rows and lse into the K/V stages' shared memory, then one
    // warp per row combines them: the block's output, or its split's partials.
    float* parts = reinterpret_cast<float*>(raw_pointer_cast(sK.data()));
    float* part_lse = parts + kWarps * 16 * kHeadDim;
    static_assert(kWarps * 16 * (kHeadDim + 1) * 4 <= 2 * cosize(typename Traits::SmemLayoutKV{}) *
                                                       int(sizeof(Element)),
                  "the warps' partial rows fit the K/V stages");
    Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
      const int row = get<0>(coords(r, 0));
      if (tid % 4 == 0) part_lse[warp * 16 + row] = softmax.row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) {
        const int col = get<1>(coords(r, c));
        if (col < kHeadDim) parts[(warp * 16 + row) * kHeadDim + col] = o(r, c);
      }
    }
    __syncthreads();
    const int64_t split_offset = int64_t(split) * p.heads * split_rows(p);
    for (int r = warp; r < rows_here; r += kWarps) {
      const int row = row0 + r;
      const int head = head_kv * group + row % group;
      const CombinedRow<kHeadDim> combined(
          kWarps, p.num_splits > 1 || p.sinks == nullptr ? -INFINITY : p.sinks[head],
          [&](int w) { return part_lse[w * 16 + r]; },
          [&](int w, int col) { return parts[(w * 16 + r) * kHeadDim + col]; }, tid % 32);
      if (p.num_splits == 1) {
        write_output_row<Element, kHeadDim>(p, seq, head, row / group, stats_row(row), combined,
                                            tid % 32);
        continue;
      }
      const int64_t stats = split_offset + stats_row(row);
      if (tid % 32 == 0) p.lse_accum[stats] = combined.lse;
      CUTE_UNROLL
      for (int i = 0; i < CombinedRow<kHeadDim>::kColsPerLane; ++i) {
        const int col = tid % 32 + 32 * i;
        if (col < kHeadDim) p.o_accum[stats * kHeadDim + col] = combined.acc[i];
      }
    }
    if (p.num_splits == 1) return;
  } else if (p.num_splits > 1) {
    // fp32 partials straight from the accumulators; the last split to finish reads them once.
    const int64_t split_offset = int64_t(split) * p.heads * split_rows(p);
    Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
      const int row = row0 + get<0>(coords(r, 0));
      if (row >= packed_rows) continue;
      const int64_t stats = split_offset + stats_row(row);
      if (tid % 4 == 0) p.lse_accum[stats] = softmax.row_max[r];
      float* out = p.o_accum + stats * kHeadDim;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) {
        const int col = get<1>(coords(r, c));
        if (col < kHeadDim) out[col] = o(r, c);
      }
    }
  }
  if (p.num_splits > 1) {
    if (!last_split_to_finish(p)) return;
    for (int r = warp; r < rows_here; r += kWarps) {
      const int row = row0 + r;
      combine_split_row<Element, kHeadDim>(p, seq, head_kv * group + row % group, row / group,
                                           stats_row(row), tid % 32);
    }
    return;
  }
  if constexpr (!kKeysAcrossWarps) {  // one split of rows across warps: store the output
    if (tid % 4 == 0) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(coords); ++r) {
        const int row = row0 + get<0>(coords(r, 0));
        if (row < packed_rows) p.softmax_lse[stats_row(row)] = softmax.row_max[r];
      }
    }
    // Staged through shared memory (Q's), then 16-byte stores to each row's (token, head).
    Tensor o_regs = make_tensor_like<Element>(acc_o);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) o_regs(i) = Element(acc_o(i));
    auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
    auto thr_copy_o = smem_copy_o.get_thread_slice(tid);
    copy(smem_copy_o, thr_copy_o.retile_S(o_regs), thr_copy_o.partition_D(sO));
    __syncthreads();
    Tensor tOsO = gmem_thr.partition_D(sO);
    Element* out =
        static_cast<Element*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_row_stride, 0, 0);
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tOsO); ++m) {
      const int row = row0 + get<0>(tQcQ(0, m, 0));
      if (row >= packed_rows) continue;
      Element* dst =
          out + (row / group) * p.o_row_stride + (head_kv * group + row % group) * p.o_head_stride;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOsO); ++k) {
        const int col = get<1>(tQcQ(0, m, k));
        if (col < kHeadDim) {
          *reinterpret_cast<uint4*>(dst + col) = *reinterpret_cast<const uint4*>(&tOsO(0, m, k));
        }
      }
    }
  }
#endif
}

}  // namespace flashgen
