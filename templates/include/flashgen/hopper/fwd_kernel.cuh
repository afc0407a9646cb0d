// The Hopper forward, warp specialised. A thread block computes tiles of kBlockM query rows of
// one (batch, head) (fwd_launch.cuh decides how many tiles each block walks). Warpgroup 0's first
// thread picks each tile, hands its index to the consumers, loads its Q once and streams its K
// and V tiles by TMA through two rings of kStages buffers (one for K, one for V, so QK^T never
// waits on V); each consumer warpgroup owns 64 query rows and runs S = Q K^T and O += P V on
// wgmma, with the online softmax between them. Key blocks run last to first, so the blocks the
// mask cuts come first and the rest run unmasked. The same kernel reads a variable-length batch
// (packed rows, cu_seqlens_q) and a KV cache, contiguous or paged (chunked prefill): TmaRows says
// where a tile's rows are.
//
// By role, each a __forceinline__ function or a small struct (every wgmma-issuing call must
// inline: ptxas serialises wgmma across a call, C7510): FwdScheduler (the tiles, what each
// computes: FwdWork) and TileHandoff; fwd_producer (TMA loads); fwd_mainloop (the GEMMs) with
// FwdSoftmax (score modifier, mask, online softmax, dropout); fwd_epilogue (lse, O's store);
// fwd_consumer sets up a consumer's fragments and runs the three per tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashgen/common/kv_cache.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/dropout.cuh"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/hopper/fragments.cuh"
#include "flashgen/hopper/fwd_traits.cuh"
#include "flashgen/hopper/warpgroup.cuh"

namespace flashgen::hopper {

// Named barriers (0 is __syncthreads): consumer w waits on kTurn + w for its turn to issue
// GEMMs; kEpilogue + w gathers consumer w's threads before its output store.
constexpr int kTurnBarrier = 1;
constexpr int kEpilogueBarrier = 4;

// Which (query block, head, batch) a thread block computes: a (batch, head)'s query blocks run
// together, so they share its K and V in L2. Under a mask that hides keys they run longest first
// (last query block first), so the short ones fill the last wave. A variable-length batch's may
// be its own query blocks instead (PackedQueryBlocks::use_tiles).
template <bool kLongestFirst>
__device__ __forceinline__ QueryTile dense_tile(int index, int m_blocks, int heads) {
  const int m = index % m_blocks;
  const int bh = index / m_blocks;
  return {kLongestFirst ? m_blocks - 1 - m : m, bh % heads, bh / heads};
}

// The tiles a block walks: its first is blockIdx.x; each next one is claimed from the params'
// tile counter where there is one (blocks then take tiles in index order as they free up, so
// tiles of unequal cost stay balanced and the tiles in flight stay neighbours, sharing K and V in
// L2), else dealt out statically (b + gridDim.x, ...).
__device__ __forceinline__ int next_tile(FwdParams const& p, int index) {
  return p.tile_counter ? int(gridDim.x) + atomicAdd(p.tile_counter, 1) : index + int(gridDim.x);
}

// The producer hands tile t's index to the consumers through slot t % 2: it waits until every
// consumer thread has taken the slot's previous tile (t - 2), writes the index and arrives on
// `ready`; a consumer thread waits on `ready`, reads and arrives on `taken`. An index past the
// last tile ends the walk. (mbarrier arrive and wait order the slot's accesses; the asm
// statements do not tell the compiler, hence the compiler fences.)
struct TileHandoff {
  using Barrier = cutlass::arch::ClusterBarrier;
  TileSlots& slots;

  __device__ void init(int consumer_threads) {
    for (int slot = 0; slot < 2; ++slot) {
      Barrier::init(&slots.ready[slot], 1);
      Barrier::init(&slots.taken[slot], consumer_threads);
    }
  }
  __device__ void send(int t, int index) {
    const int slot = t & 1;
    if (t >= 2) Barrier::wait(&slots.taken[slot], ((t >> 1) - 1) & 1);
    asm volatile("" ::: "memory");
    slots.index[slot] = index;
    asm volatile("" ::: "memory");
    Barrier::arrive(&slots.ready[slot]);
  }
  __device__ int receive(int t) {
    const int slot = t & 1;
    Barrier::wait(&slots.ready[slot], (t >> 1) & 1);
    asm volatile("" ::: "memory");
    const int index = slots.index[slot];
    asm volatile("" ::: "memory");
    Barrier::arrive(&slots.taken[slot]);
    return index;
  }
};

// Where one sequence's rows are in the TMA tensors (rows, head dim, heads, slots), whose slots are
// the views' leading extent: a query slab's first row and slot, and each key block's. Dense: from
// row 0 of slot `batch`; packed (a variable-length batch): from the sequence's first row of slot
// 0; a contiguous cache: row 0 of the cache row cache_batch_idx[batch]; a paged cache: the
// block's row in its page, whose slot is the page (the launcher takes page sizes that are
// multiples of kBlockN, so a block never spans two pages).
//
// A cache holds whatever was there past a sequence's keys, NaN included, and P = 0 times a NaN
// of V is NaN. So over a cache a partial last key block loads shifted back to end at the
// sequence's last key (shift < 0): its rows are then the sequence's keys, the earlier ones
// (which the previous block counted, so masked: KeysFrom) or rows before the slot's first, which
// TMA fills with zeros.
template <int kBlockN>
struct TmaRows {
  int q_row0, q_slot;  // a paged cache's q is dense: q_slot is then the sequence's batch index
  int k_row0, k_slot;
  int cached_keys;  // over a cache, the sequence's keys (its tail block loads shifted); else 0

  __device__ __forceinline__ static TmaRows of(FwdParams const& p, DenseSeqs const& seq,
                                              bool cache) {
    const int q_slot = seq.packed ? 0 : seq.batch;
    return {int(seq.q_start), q_slot, int(seq.k_start),
            p.cache_batch_idx != nullptr ? p.cache_batch_idx[seq.batch] : q_slot,
            cache ? seq.seqlen_k : 0};
  }
  // A dense batch's sequence: every row from row 0 of its own slot.
  __device__ __forceinline__ static TmaRows of_batch(int batch) {
    return {0, batch, 0, batch, 0};
  }

  // Whether key block n_block lies where the blocks from (k_row0, k_slot) in order put it.
  __device__ __forceinline__ bool in_order(FwdParams const& p, int n_block) const {
    return p.block_table == nullptr && shift(n_block) == 0;
  }
  // How far back key block n_block loads: a partial last block of a cache's keys, to end at the
  // last key.
  __device__ __forceinline__ int shift(int n_block) const {
    const int partial = cached_keys % kBlockN;
    return partial != 0 && n_block == cached_keys / kBlockN ? partial - kBlockN : 0;
  }
  // Key block n_block's first row (x) and slot (y). The block table and page size stay in the
  // kernel's parameters (no registers held across the loop: the producer has few).
  __device__ __forceinline__ int2 key_block(FwdParams const& p, int n_block) const {
    const int key = n_block * kBlockN;
    if (p.block_table == nullptr) return {k_row0 + key + shift(n_block), k_slot};
    const int page = key / p.page_size;
    return {key - page * p.page_size + shift(n_block),
            p.block_table[q_slot * p.block_table_batch_stride + page]};
  }
};

// A mask that also hides the keys before `first` (those of a shifted tail block that the
// previous block has counted).
template <class Mask>
struct KeysFrom {
  Mask mask;
  int first;
  __device__ __forceinline__ bool visible(int row, int col) const {
    return col >= first && mask.visible(row, col);
  }
};

// The TMA descriptors, one kernel parameter in constant space.
template <class TmaQ, class TmaK, class TmaV, class TmaO>
struct FwdTmas {
  TmaQ q;
  TmaK k;
  TmaV v;
  TmaO o;
};

// A consumer's staged output slab (64 x head dim, shared memory) -> its rows inside the sequence
// (those from row0 on, at most 64), 16 bytes per store by the warpgroup's 128 threads. A swizzled
// slab keeps each aligned 8-element run of a row contiguous.
template <int kHeadDim, class Slab>
__device__ __forceinline__ void store_rows(Slab const& slab, FwdParams const& p,
                                           DenseSeqs const& seq, int head, int row0, int thread) {
  using Element = typename Slab::value_type;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte runs per row
  const int rows = min(64, seq.seqlen_q - row0);
  Element* out = static_cast<Element*>(p.o) +
                 seq.q_offset(p.o_batch_stride, p.o_row_stride, p.o_head_stride, head) +
                 int64_t(row0) * p.o_row_stride;
  for (int i = thread; i < rows * kChunks; i += 128) {
    const int row = i / kChunks;
    const int col = i % kChunks * 8;
    *reinterpret_cast<uint4*>(out + row * p.o_row_stride + col) =
        *reinterpret_cast<const uint4*>(&slab(row, col));
  }
}

// What one tile computes: its query block, sequence, TMA rows and mask, and the key blocks it
// visits (n_last, then each below() down to n_first).
template <class Traits, class Mask>
struct FwdWork {
  QueryTile tile;
  DenseSeqs seq;
  TmaRows<Traits::kBlockN> rows;
  Mask mask;
  bool past_end;  // a packed sequence shorter than the longest: nothing to compute or store
  int n_first;
  int n_last;

  __device__ __forceinline__ bool has_keys() const { return n_last >= n_first; }
  // The key block visited after n_block, first - 1 after the last.
  __device__ __forceinline__ int below(int n_block) const {
    return key_block_below<Traits::kBlockM, Traits::kBlockN>(mask, tile.m_block, n_block,
                                                             n_first);
  }
};

// The tile scheduler: how many tiles there are and what tile `index` computes. Producer and
// consumers build the same one and walk the same tiles (next_tile, TileHandoff), so they make the
// same decisions from them. kDense: every sequence is a (batch, seq) slice of q, k, v and o, as
// from flash_attn_func; else also packed variable-length batches and KV caches (TmaRows).
template <class Traits, class Mask, bool kDense>
struct FwdScheduler {
  using Packed = PackedQueryBlocks<Traits::kBlockM>;
  int m_blocks;
  bool packed;
  int tiles;
  // Over a KV cache a sequence sees its cached keys and the appended ones, masked bottom-right.
  bool reads_cache;

  __device__ __forceinline__ explicit FwdScheduler(FwdParams const& p)
      : m_blocks((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
        packed(!kDense && Packed::use_tiles(p)),
        tiles(packed ? int(Packed::tiles(p)) : m_blocks * p.heads * p.batch),
        reads_cache(!kDense && (p.cache_seqlens != nullptr || p.cache_batch_idx != nullptr ||
                                p.block_table != nullptr)) {}

  __device__ __forceinline__ FwdWork<Traits, Mask> work(FwdParams const& p, int index) const {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    const QueryTile tile = packed ? Packed::tile(p, index, Mask::kHidesKeys)
                                  : dense_tile<Mask::kHidesKeys>(index, m_blocks, p.heads);
    DenseSeqs seq(p, tile.batch);
    if (reads_cache) {
      seq.seqlen_k = CachedKeys(p, tile.batch).seqlen_k;
      seq.mask_offset = seq.seqlen_k - seq.seqlen_q;
    }
    const Mask mask = Mask(p, tile.batch, seq.seqlen_k, seq.mask_offset).for_head(tile.head);
    const bool past_end = !kDense && tile.m_block * kBlockM >= seq.seqlen_q;
    const int last_row = min(seq.seqlen_q, (tile.m_block + 1) * kBlockM) - 1;
    const auto rows = kDense ? TmaRows<kBlockN>::of_batch(tile.batch)
                             : TmaRows<kBlockN>::of(p, seq, reads_cache);
    const int n_begin = mask.template key_block_begin<kBlockN>(tile.m_block * kBlockM);
    const int n_end = past_end ? n_begin : mask.template key_block_end<kBlockN>(last_row);
    const int2 visited = visited_key_blocks<kBlockM, kBlockN>(mask, tile.m_block, n_begin, n_end);
    return {tile, seq, rows, mask, past_end, visited.x, visited.y};
  }
};

// The key blocks of K or V (the tma's tensor m, (rows, head dim, heads, slots)) of KV head
// `head_kv` from `row` of `slot`, partitioned for the tma into the ring s, (block_n, head dim,
// stages): (tma's key blocks, (TMA, blocks); the ring's stages, (TMA, stages)).
template <class Traits, class Tma, class GTensor, class STensor>
__device__ __forceinline__ auto tma_key_blocks(Tma const& tma, GTensor const& m, STensor const& s,
                                               int head_kv, int row, int slot) {
  using namespace cute;
  // (block_n, head dim, blocks)
  Tensor g = local_tile(domain_offset(make_coord(row, _0{}), m(_, _, head_kv, slot)),
                        Shape<Int<Traits::kBlockN>, typename Traits::HD>{}, make_coord(_, _0{}));
  return tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
}

// Key block n_block of K or V into its ring's next stage: from the tile's in-order blocks where it
// lies there, else (a page, a shifted tail) from a tiling at its own row.
template <class Traits, bool kDense, class Tma, class GTensor, class STensor, class GBlocks,
          class SStages, class Pipeline>
__device__ __forceinline__ void load_key_block(
    FwdParams const& p, TmaRows<Traits::kBlockN> const& rows, int head_kv, Tma const& tma,
    GTensor const& m, STensor const& s, GBlocks const& in_order, SStages const& stages,
    Pipeline& pipeline, typename Pipeline::PipelineState& state, int n_block) {
  using namespace cute;
  pipeline.producer_acquire(state);
  auto& barrier = *pipeline.producer_get_barrier(state);
  if constexpr (kDense) {
    copy(tma.with(barrier), in_order(_, n_block), stages(_, state.index()));
  } else if (rows.in_order(p, n_block)) {
    copy(tma.with(barrier), in_order(_, n_block), stages(_, state.index()));
  } else {
    const int2 at = rows.key_block(p, n_block);
    copy(tma.with(barrier), get<0>(tma_key_blocks<Traits>(tma, m, s, head_kv, at.x, at.y))(_, 0),
         stages(_, state.index()));
  }
  ++state;
}

// An fp8 forward's V^T columns (params.h's q_descale, flashgen/fp8.py's transposed_v): a dense
// batch's, each sequence's keys from column 0 of its slot; a packed batch's, each sequence's from
// a column of its own, 16 * ceil(k_start / 16) + 16 * its index, so that the last group of 16
// columns its keys are permuted within (fp8_key_of_slot) never holds the next sequence's.
__host__ __device__ __forceinline__ int vt_columns(FwdParams const& p) {
  return p.cu_seqlens_q == nullptr ? p.kv_view_rows
                                   : (p.kv_view_rows + 15) / 16 * 16 + 16 * p.batch;
}
__device__ __forceinline__ int vt_first_column(FwdParams const& p, int64_t k_start, int batch) {
  return p.cu_seqlens_q == nullptr ? 0 : int((k_start + 15) / 16 * 16) + 16 * batch;
}

// An fp8 forward's V^T (the tma's tensor m, (head dim, columns, heads, slots), columns contiguous)
// of KV head `head_kv` from column col0 of `slot`, partitioned for the tma into the ring s, (head
// dim, block_n, stages): as tma_key_blocks'.
template <class Traits, class Tma, class GTensor, class STensor>
__device__ __forceinline__ auto tma_key_blocks_vt(Tma const& tma, GTensor const& m,
                                                  STensor const& s, int head_kv, int col0,
                                                  int slot) {
  using namespace cute;
  // (head dim, block_n, blocks)
  Tensor g = local_tile(domain_offset(make_coord(_0{}, col0), m(_, _, head_kv, slot)),
                        Shape<typename Traits::HD, Int<Traits::kBlockN>>{}, make_coord(_0{}, _));
  return tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
}

// The producer (warpgroup 0's first thread): hands each tile's index to the consumers, then loads
// the tile's Q once (each consumer's 64-row slab) and streams its key blocks' K and V, K one block
// ahead of V: the consumers need K of block n before V of block n + 1.
template <class Traits, class Mask, bool kDense, class Tmas>
__device__ __forceinline__ void fwd_producer(FwdParams const& p, Tmas const& tmas,
                                             typename Traits::SharedStorage& smem,
                                             FwdScheduler<Traits, Mask, kDense> const& scheduler,
                                             TileHandoff& handoff,
                                             typename Traits::PipelineKV& pipeline_k,
                                             typename Traits::PipelineKV& pipeline_v) {
  using namespace cute;
  using Pipeline = typename Traits::PipelineKV;
  using HD = typename Traits::HD;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kConsumers = Traits::kConsumers;
  using KV = typename Traits::SmemLayoutKV;
  using QLayout = typename Traits::SmemLayoutQ;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), QLayout{});  // (64, HD, kConsumers)
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), KV{});  // (BLK_N, HD, PIPE)
  // (BLK_N, HD, PIPE); fp8: V^T's (HD, BLK_N, PIPE)
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()),
                          std::conditional_t<Traits::kFp8, typename Traits::SmemLayoutVt, KV>{});
  // (rows, HD, heads, slots) of the TMA views; K's and V's of the KV heads (fp8: V^T's (HD,
  // rows, heads_kv, slots))
  Tensor mQ = tmas.q.get_tma_tensor(make_shape(p.q_view_rows, HD{}, p.heads, p.q_view_batch));
  Tensor mK = tmas.k.get_tma_tensor(
      make_shape(p.kv_view_rows, HD{}, p.heads_kv, p.kv_view_batch));  // (rows, HD, heads_kv, ..)
  auto v_shape = [&] {
    if constexpr (Traits::kFp8) {
      return make_shape(HD{}, vt_columns(p), p.heads_kv, p.kv_view_batch);
    } else {
      return make_shape(p.kv_view_rows, HD{}, p.heads_kv, p.kv_view_batch);
    }
  };
  Tensor mV = tmas.v.get_tma_tensor(v_shape());
  auto k_state = cutlass::make_producer_start_state<Pipeline>();
  auto v_state = cutlass::make_producer_start_state<Pipeline>();
  int q_loads = 0;
  for (int t = 0, index = blockIdx.x;; ++t, index = next_tile(p, index)) {
    handoff.send(t, index);
    if (index >= scheduler.tiles) break;
    const FwdWork<Traits, Mask> w = scheduler.work(p, index);
    if (!w.has_keys()) continue;
    const int head_kv = w.tile.head / (p.heads / p.heads_kv);
    Tensor gQ = local_tile(
        domain_offset(make_coord(w.rows.q_row0, _0{}), mQ(_, _, w.tile.head, w.rows.q_slot)),
        Shape<_64, HD>{}, make_coord(_, _0{}));  // (64, HD, slabs)
    auto [tQgQ, tQsQ] = tma_partition(tmas.q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));  // (TMA, slabs), (TMA, kConsumers)
    auto [tKgK, tKsK] = tma_key_blocks<Traits>(tmas.k, mK, sK, head_kv, w.rows.k_row0,
                                               w.rows.k_slot);  // (TMA, blocks), (TMA, PIPE)
    auto v_blocks = [&] {
      if constexpr (Traits::kFp8) {
        return tma_key_blocks_vt<Traits>(tmas.v, mV, sV, head_kv,
                                         vt_first_column(p, w.seq.k_start, w.tile.batch),
                                         w.rows.k_slot);
      } else {
        return tma_key_blocks<Traits>(tmas.v, mV, sV, head_kv, w.rows.k_row0, w.rows.k_slot);
      }
    };
    auto [tVgV, tVsV] = v_blocks();  // (TMA, blocks), (TMA, PIPE)

    int n_block = w.n_last;
    load_key_block<Traits, kDense>(p, w.rows, head_kv, tmas.k, mK, sK, tKgK, tKsK, pipeline_k,
                                   k_state, n_block);
    // Q's buffer is free once the consumers are done with the previous Q (and, without an own
    // output buffer, with the output staged over it).
    if (q_loads > 0) Barrier::wait(&smem.q_free, (q_loads - 1) & 1);
    ++q_loads;
    TxBarrier::arrive_and_expect_tx(&smem.q_full, kConsumers * Traits::kSlabBytes);
    CUTE_UNROLL
    for (int c = 0; c < kConsumers; ++c) {
      copy(tmas.q.with(smem.q_full), tQgQ(_, w.tile.m_block * kConsumers + c), tQsQ(_, c));
    }
    while (n_block >= w.n_first) {
      const int next = w.below(n_block);
      if (next >= w.n_first) {
        load_key_block<Traits, kDense>(p, w.rows, head_kv, tmas.k, mK, sK, tKgK, tKsK,
                                       pipeline_k, k_state, next);
      }
      // V^T's blocks lie in order: an fp8 forward reads no cache (fwd_launch.cuh).
      load_key_block<Traits, kDense || Traits::kFp8>(p, w.rows, head_kv, tmas.v, mV, sV, tVgV,
                                                      tVsV, pipeline_v, v_state, n_block);
      n_block = next;
    }
  }
}

// Ping-pong: consumer c issues its GEMMs between waiting on turn c and passing turn c + 1. In
// each tile the last consumer opens the first turn; every consumer has the same number of turns,
// so the last one skips passing on its final turn, which leaves no barrier with a pending arrival
// at the tile's end. Without ping-pong, no turns.
template <class Traits>
struct GemmTurns {
  int consumer;

  __device__ __forceinline__ void open() const {
    if constexpr (Traits::kPingpong) {
      if (consumer == Traits::kConsumers - 1) named_arrive(kTurnBarrier, 256);
    }
  }
  __device__ __forceinline__ void wait() const {
    if constexpr (Traits::kPingpong) named_sync(kTurnBarrier + consumer, 256);
  }
  __device__ __forceinline__ void pass(bool final_turn) const {
    if constexpr (Traits::kPingpong) {
      if (!(final_turn && consumer == Traits::kConsumers - 1)) {
        named_arrive(kTurnBarrier + (consumer + 1) % Traits::kConsumers, 256);
      }
    }
  }
};

// An fp8 forward's dequantisation factor of q, k or v (params.h's q_descale and the others) for
// (batch, KV head); 1 without factors.
__device__ __forceinline__ float descale(const float* factors, int64_t batch_stride,
                                         int64_t head_stride, int batch, int head_kv) {
  return factors == nullptr ? 1.f : factors[batch * batch_stride + head_kv * head_stride];
}

// The softmax of one consumer's 64 rows of a tile: on each key block's scores the score modifier
// and the mask, then the online softmax, then dropout on the probabilities (after the row sums
// saw them all); at the end the division by the row sums and dropout's scale. An fp8 forward's
// scores take q's and k's descales in the softmax's scale and the output v's at the end.
template <class Traits, class Mask, class ScoreMod, class Dropout, bool kDense>
struct FwdSoftmax {
  // A copy, not a reference to the consumer's: with a reference ptxas emits the mask with
  // inverted predicates in the dense kernel and 8 more instructions in the general one.
  FwdWork<Traits, Mask> const w;
  int row0;  // the consumer's first query row
  ScoreMod score_mod;
  Dropout dropout;
  OnlineSoftmax online;
  float sink;  // the head's sink in exp2 units (-inf: none)
  float v_descale;  // fp8: v's factor on the output

  __device__ __forceinline__ FwdSoftmax(FwdParams const& p, FwdWork<Traits, Mask> const& w,
                                        int row0)
      : w(w), row0(row0), score_mod(p, w.tile.batch, w.tile.head, w.seq.mask_offset),
        dropout(p, w.tile.batch, w.tile.head), online(scale_log2(p, w)),
        sink(sink_log2(p, w.tile.head)),
        v_descale(Traits::kFp8 ? descale(p.v_descale, p.v_descale_batch_stride,
                                         p.v_descale_head_stride, w.tile.batch, head_kv(p, w))
                               : 1.f) {}

  __device__ __forceinline__ static int head_kv(FwdParams const& p,
                                                FwdWork<Traits, Mask> const& w) {
    return w.tile.head / (p.heads / p.heads_kv);
  }
  __device__ __forceinline__ static float scale_log2(FwdParams const& p,
                                                     FwdWork<Traits, Mask> const& w) {
    if constexpr (!Traits::kFp8) return p.scale_log2;
    const int h = head_kv(p, w), b = w.tile.batch;
    return p.scale_log2 *
           descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, b, h) *
           descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, b, h);
  }

  // tSrS: (MMA, MMA_M, MMA_N) scores of key block n_block -> probabilities; tScS: their (row,
  // key) in the tile. rescale[r]: what the output's row r accumulated so far is multiplied by.
  template <bool kFirst, class Scores, class Coords>
  __device__ __forceinline__ void step(Scores& tSrS, Coords const& tScS, int n_block,
                                       float (&rescale)[2]) {
    using namespace cute;
    const int col0 = n_block * Traits::kBlockN;
    if (const int shift = w.rows.shift(n_block); !kDense && shift != 0) {
      apply_score_mod(score_mod, tSrS, tScS, row0, col0 + shift);
      apply_mask(KeysFrom<Mask>{w.mask, col0}, tSrS, tScS, row0, col0 + shift);
    } else {
      apply_score_mod(score_mod, tSrS, tScS, row0, col0);
      if (w.mask.template tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(w.tile.m_block,
                                                                            n_block)) {
        apply_mask_one_row_group<Traits::kBlockN>(w.mask, tSrS, tScS, row0, col0);
      }
    }
    online.template update<kFirst>(tSrS, rescale);
    if constexpr (Dropout::kEnabled) {
      const int shift = kDense ? 0 : w.rows.shift(n_block);
      Tensor probs = make_tensor(tSrS.data(), rows_by_cols(tSrS.layout()));   // (2, cols)
      Tensor coords = make_tensor(tScS.data(), rows_by_cols(tScS.layout()));  // (2, cols)
      for_each_dropout_decision(dropout, coords, row0, col0 + shift, [&](int r, int c, bool keep) {
        probs(r, c) = keep ? probs(r, c) : 0.f;
      });
    }
  }

  // tOrO: (MMA, MMA_M, MMA_N) the output accumulator; lse[r]: row r's natural-log sum.
  template <class Acc>
  __device__ __forceinline__ void finish(Acc& tOrO, float (&lse)[2]) {
    online.finish(tOrO, lse, sink);
    if constexpr (Dropout::kEnabled) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(tOrO); ++i) tOrO(i) *= dropout.scale;
    }
    if constexpr (Traits::kFp8) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(tOrO); ++i) tOrO(i) *= v_descale;
    }
  }
};

// The consumer mainloop of one tile with keys: per key block, S = Q K^T, the softmax, and
// O += P V, on the K and V rings; release_q() after the thread's last QK^T. With kOverlap, block
// n's QK^T and block n + 1's PV go out together, and the softmax of block n runs while the PV is
// still on the tensor cores; else each GEMM is waited for in turn.
// tSrQ: (MMA, MMA_M, MMA_K) and tSrK: (MMA, MMA_N, MMA_K, PIPE) descriptors; tOrV: (MMA, MMA_N,
// MMA_K, PIPE) descriptors of V^T; tSrS: (MMA, MMA_M, MMA_N) fp32 scores and tSrP the same in
// 16 bits, seen by tOrP as PV's A operand (MMA, MMA_M, MMA_K); tOrO: (MMA, MMA_M, MMA_N) fp32.
template <class Traits, class Work, class Softmax, class MmaS, class MmaO, class FragQ,
          class FragK, class FragV, class AccS, class FragP, class FragPA, class AccO,
          class Coords, class ReleaseQ>
__device__ __forceinline__ void fwd_mainloop(
    Work const& w, GemmTurns<Traits> turns, typename Traits::PipelineKV& pipeline_k,
    typename Traits::PipelineKV& pipeline_v, typename Traits::PipelineKV::PipelineState& k_state,
    typename Traits::PipelineKV::PipelineState& v_state, Softmax& softmax, MmaS& mma_s,
    MmaO& mma_o, FragQ const& tSrQ, FragK const& tSrK, FragV const& tOrV, AccS& tSrS,
    FragP& tSrP, FragPA const& tOrP, AccO& tOrO, Coords const& tScS, ReleaseQ release_q) {
  using namespace cute;
  float rescale[2];
  int n_block = w.n_last;
  turns.wait();
  pipeline_k.consumer_wait(k_state);
  warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, k_state.index()), tSrS);
  turns.pass(!Traits::kOverlap && w.n_last == w.n_first);
  warpgroup_wait<0>();
  pipeline_k.consumer_release(k_state);
  ++k_state;
  softmax.template step<true>(tSrS, tScS, n_block, rescale);
  if (!Traits::kOverlap && n_block == w.n_first) release_q();

  if constexpr (Traits::kOverlap) {
    probabilities_into(tSrP, tSrS);
    for (n_block = w.below(n_block); n_block >= w.n_first; n_block = w.below(n_block)) {
      turns.wait();
      pipeline_k.consumer_wait(k_state);
      warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, k_state.index()), tSrS);
      pipeline_v.consumer_wait(v_state);
      warpgroup_gemm<false>(mma_o, tOrP, tOrV(_, _, _, v_state.index()), tOrO);
      turns.pass(false);
      warpgroup_wait<1>();
      pipeline_k.consumer_release(k_state);
      ++k_state;
      softmax.template step<false>(tSrS, tScS, n_block, rescale);
      warpgroup_wait<0>();
      pipeline_v.consumer_release(v_state);
      ++v_state;
      scale_rows(tOrO, rescale);
      probabilities_into(tSrP, tSrS);
    }
    release_q();
    turns.wait();
    pipeline_v.consumer_wait(v_state);
    warpgroup_gemm<false>(mma_o, tOrP, tOrV(_, _, _, v_state.index()), tOrO);
    turns.pass(true);
    warpgroup_wait<0>();
    pipeline_v.consumer_release(v_state);
    ++v_state;
  } else {
    for (;;) {
      probabilities_into(tSrP, tSrS);
      pipeline_v.consumer_wait(v_state);
      warpgroup_gemm<false>(mma_o, tOrP, tOrV(_, _, _, v_state.index()), tOrO);
      warpgroup_wait<0>();
      pipeline_v.consumer_release(v_state);
      ++v_state;
      n_block = w.below(n_block);
      if (n_block < w.n_first) break;
      turns.wait();
      pipeline_k.consumer_wait(k_state);
      warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, k_state.index()), tSrS);
      turns.pass(n_block == w.n_first);
      warpgroup_wait<0>();
      if (n_block == w.n_first) release_q();
      pipeline_k.consumer_release(k_state);
      ++k_state;
      softmax.template step<false>(tSrS, tScS, n_block, rescale);
      scale_rows(tOrO, rescale);
    }
  }
}

// The epilogue of one consumer's 64 rows of a tile: lse, (batch, heads, seqlen_q), from the first
// thread of each quad (its two rows'); O: registers -> this consumer's rows of the output buffer
// (its own, or Q's once its last QK^T has read them) -> global by TMA, which drops the rows past
// the tensor's. A packed sequence's last slab would spill into the next sequence's rows: its
// threads store the rows inside the sequence themselves. tOrO: (MMA, MMA_M, MMA_N) fp32, divided
// by the row sums; tScS: (MMA, MMA_M, MMA_N) the scores' (row, key) coordinates.
template <class Traits, bool kDense, class Work, class Tmas, class Store, class AccO,
          class FragOut, class SOut, class GOut, class Coords>
__device__ __forceinline__ void fwd_epilogue(FwdParams const& p, Tmas const& tmas,
                                             typename Traits::SharedStorage& smem, Work const& w,
                                             int consumer, int thread, int row0,
                                             Store const& store, AccO const& tOrO,
                                             FragOut& tOrO_out, SOut const& sO, GOut const& mO,
                                             Coords const& tScS, float const (&lse)[2]) {
  using namespace cute;
  using HD = typename Traits::HD;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kConsumers = Traits::kConsumers;
  if (thread % 4 == 0) {
    Tensor rows = make_tensor(tScS.data(), rows_by_cols(tScS.layout()));  // (2, cols)
    float* lse_rows = p.softmax_lse + w.seq.row_stats_offset(p.heads, w.tile.head);
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + get<0>(rows(r, 0));
      if (row < w.seq.seqlen_q) lse_rows[row] = lse[r];
    }
  }

  auto thr_store = store.get_thread_slice(thread);
  convert_into(tOrO_out, tOrO);
  // The previous tile's store of the same rows must have read them. In Q's buffer the next Q
  // load waited for that, except after a tile without keys, which loaded no Q.
  if (Traits::kOwnOutputBuffer || !w.has_keys()) {
    if (Traits::kOwnOutputBuffer && thread == 0) tma_store_wait<0>();
    named_sync(kEpilogueBarrier + consumer, 128);
  }
  copy(store, thr_store.retile_S(tOrO_out), thr_store.partition_D(sO(_, _, consumer)));
  const bool partial_slab = !kDense && w.seq.packed && row0 + 64 > w.seq.seqlen_q;
  if (partial_slab) {
    named_sync(kEpilogueBarrier + consumer, 128);
    store_rows<Traits::kHeadDim>(sO(_, _, consumer), p, w.seq, w.tile.head, row0, thread);
    if constexpr (!Traits::kOwnOutputBuffer) {
      named_sync(kEpilogueBarrier + consumer, 128);  // every thread has read the rows
      if (thread == 0 && w.has_keys()) Barrier::arrive(&smem.q_free);
    }
    return;
  }
  cutlass::arch::fence_view_async_shared();
  named_sync(kEpilogueBarrier + consumer, 128);
  if (thread == 0) {
    Tensor gO = local_tile(
        domain_offset(make_coord(w.rows.q_row0, _0{}), mO(_, _, w.tile.head, w.rows.q_slot)),
        Shape<_64, HD>{}, make_coord(_, _0{}));  // (64, HD, slabs)
    auto [tOgO, tOsO] = tma_partition(tmas.o, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                      group_modes<0, 2>(gO));  // (TMA, slabs), (TMA, kConsumers)
    copy(tmas.o, tOsO(_, consumer), tOgO(_, w.tile.m_block * kConsumers + consumer));
    tma_store_arrive();
    if constexpr (!Traits::kOwnOutputBuffer) {
      tma_store_wait<0>();
      if (w.has_keys()) Barrier::arrive(&smem.q_free);
    }
  }
}

// A consumer warpgroup: 64 query rows of each tile the producer hands it.
template <class Traits, class Mask, class ScoreMod, class Dropout, bool kDense, class Tmas>
__device__ __forceinline__ void fwd_consumer(FwdParams const& p, Tmas const& tmas,
                                             typename Traits::SharedStorage& smem,
                                             FwdScheduler<Traits, Mask, kDense> const& scheduler,
                                             TileHandoff& handoff, int consumer,
                                             typename Traits::PipelineKV& pipeline_k,
                                             typename Traits::PipelineKV& pipeline_v) {
  using namespace cute;
  using Element = typename Traits::Element;
  using ElementOut = typename Traits::ElementOut;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBlockN = Traits::kBlockN;
  using HD = typename Traits::HD;
  const int thread = threadIdx.x % 128;
  using QLayout = typename Traits::SmemLayoutQ;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), QLayout{});  // (64, HD, kConsumers)
  using KvLayout = typename Traits::SmemLayoutKV;
  using VtLayout = typename Traits::SmemLayoutVt;  // V's bytes as PV's B operand, V^T
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), KvLayout{});   // (BLK_N, HD, PIPE)
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), VtLayout{});  // (HD, BLK_N, PIPE)

  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(thread);
  auto thr_o = mma_o.get_thread_slice(thread);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ(_, _, consumer));  // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_s.partition_fragment_B(sK);                  // (MMA, MMA_N, MMA_K, PIPE)
  Tensor tOrV = thr_o.partition_fragment_B(sVt);                 // (MMA, MMA_N, MMA_K, PIPE)
  Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
  Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, HD>{});            // (MMA, MMA_M, MMA_N)
  // P: 16-bit, in the scores' layout (MMA, MMA_M, MMA_N), seen as PV's A operand (MMA, MMA_M,
  // MMA_K); 8-bit, in the A operand's own (pack_fp8_probabilities).
  auto p_registers = [&] {
    if constexpr (Traits::kFp8) {
      return make_tensor<Element>(partition_shape_A(mma_o, Shape<_64, Int<kBlockN>>{}));
    } else {
      return make_tensor<Element>(tSrS.layout());
    }
  };
  Tensor tSrP = p_registers();
  auto p_operand = [&] {
    if constexpr (Traits::kFp8) return tSrP.layout(); else return acc_as_a_operand(tSrP.layout());
  };
  Tensor tOrP = make_tensor(tSrP.data(), p_operand());  // (MMA, MMA_M, MMA_K)
  // (MMA, MMA_M, MMA_N) -> (row, key) in the tile
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<_64, Int<kBlockN>>{}));
  // The epilogue's: O in 16 bits, (MMA, MMA_M, MMA_N); its stmatrix copy; O's staging buffer
  // (its own, or Q's, 16-bit then), (64, HD, kConsumers); the TMA view of o, (rows, HD, heads,
  // slots).
  Tensor tOrO_out = make_tensor<ElementOut>(tOrO.layout());
  auto store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, ElementOut>{}, mma_o);
  auto output_buffer = [&] {
    if constexpr (Traits::kOwnOutputBuffer) return smem.o.data(); else return smem.q.data();
  };
  Tensor sO = make_tensor(make_smem_ptr(output_buffer()),
                          typename Traits::SmemLayoutO{});  // (64, HD, kConsumers)
  Tensor mO = tmas.o.get_tma_tensor(
      make_shape(p.q_view_rows, HD{}, p.heads, p.q_view_batch));  // (rows, HD, heads, slots)

  const GemmTurns<Traits> turns{consumer};
  typename Traits::PipelineKV::PipelineState k_state, v_state;
  int q_loads = 0;
  for (int t = 0;; ++t) {
    const int index = handoff.receive(t);
    if (index >= scheduler.tiles) break;
    const FwdWork<Traits, Mask> w = scheduler.work(p, index);
    if (w.past_end) continue;
    const int row0 = w.tile.m_block * Traits::kBlockM + consumer * 64;
    FwdSoftmax<Traits, Mask, ScoreMod, Dropout, kDense> softmax(p, w, row0);
    clear(tOrO);
    if (w.has_keys()) {
      turns.open();
      TxBarrier::wait(&smem.q_full, q_loads++ & 1);
      // After this thread's last QK^T: with an own output buffer every consumer thread frees Q.
      auto release_q = [&] {
        if constexpr (Traits::kOwnOutputBuffer) Barrier::arrive(&smem.q_free);
      };
      fwd_mainloop<Traits>(w, turns, pipeline_k, pipeline_v, k_state, v_state, softmax, mma_s,
                           mma_o, tSrQ, tSrK, tOrV, tSrS, tSrP, tOrP, tOrO, tScS, release_q);
    }
    float lse[2];
    softmax.finish(tOrO, lse);
    fwd_epilogue<Traits, kDense>(p, tmas, smem, w, consumer, thread, row0, store, tOrO,
                                 tOrO_out, sO, mO, tScS, lse);
  }
  // Shared memory must outlive the reads of the last store.
  if (thread == 0) tma_store_wait<0>();
}

// Warp specialised: warpgroup 0's first thread produces (fwd_producer), every other warpgroup
// consumes (fwd_consumer). kDense: the dense-only instantiation; packed batches and KV caches
// cost dense calls 1-3% (H100) in run-time branches, hence an instantiation of their own.
template <class Traits, class Mask, class ScoreMod, class Dropout, bool kDense, class Tmas>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_kernel(CUTE_GRID_CONSTANT FwdParams const p, CUTE_GRID_CONSTANT Tmas const tmas) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Pipeline = typename Traits::PipelineKV;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_bytes);

  const FwdScheduler<Traits, Mask, kDense> scheduler(p);
  const int warpgroup = cutlass::canonical_warp_group_idx();
  const bool producer_thread = threadIdx.x == 0;

  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kTileBytes;
  pipe_params.role = warpgroup == 0 ? Pipeline::ThreadCategory::Producer
                                    : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = producer_thread;
  pipe_params.num_consumers = Traits::kConsumerThreads;
  Pipeline pipeline_k(smem.pipeline_k, pipe_params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  Pipeline pipeline_v(smem.pipeline_v, pipe_params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  TileHandoff handoff{smem.tile_slots};
  if (producer_thread) {
    handoff.init(Traits::kConsumerThreads);
    // q_full and q_free count the tiles that load a Q (those with keys). With an own output
    // buffer every consumer thread frees Q after its last QK^T; without, each consumer's storing
    // thread once its store has read the rows.
    TxBarrier::init(&smem.q_full, 1);
    Barrier::init(&smem.q_free,
                  Traits::kOwnOutputBuffer ? Traits::kConsumerThreads : Traits::kConsumers);
    prefetch_tma_descriptors(tmas.q, tmas.k, tmas.v, tmas.o);
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (producer_thread) {
      fwd_producer<Traits, Mask, kDense>(p, tmas, smem, scheduler, handoff, pipeline_k,
                                         pipeline_v);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  fwd_consumer<Traits, Mask, ScoreMod, Dropout, kDense>(p, tmas, smem, scheduler, handoff,
                                                        warpgroup - 1, pipeline_k, pipeline_v);
#endif
}

}  // namespace flashgen::hopper
