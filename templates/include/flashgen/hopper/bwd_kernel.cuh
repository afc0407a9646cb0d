// The Hopper backward, warp specialised (FlashAttention-2's algorithm on wgmma and TMA). A thread
// block owns kBlockN keys of one (batch, KV head): their K and V stay in shared memory and their
// dK and dV accumulate in the consumers' registers while the block walks the query blocks that
// see them, of every query head of the KV head's group (so GQA's sums need no second pass).
// Warpgroup 0's first thread loads K and V once and streams each query block's Q (with its rows'
// lse) and dO (with D) by TMA through two rings. Each consumer warpgroup owns 64 of the keys:
//   S^T = K Q^T, dP^T = V dO^T; P^T = exp2(S^T - lse), dS^T = P^T (dP^T - D);
//   dV += P^T dO, dK += dS^T Q (P^T and dS^T straight from registers);
//   dS^T -> shared memory; after all consumers have written theirs, dQ_share = dS K;
// or, above head dim 128, the two consumers share 64 keys, each computing S^T and dP^T for half
// the query rows and, once both have put P^T and dS^T in shared memory, dV, dK and dQ for half
// the head dim's columns (bwd_traits.cuh). Each consumer stages its dQ share in shared memory
// for warpgroup 0's second warp, which stores it to the fp32 workspace by a bulk copy where its
// block is the first to reach the query block and adds it by bulk reduce-adds after that (a
// deterministic run: in each query block's turn), or, split by the head dim, adds it from its
// registers (to a zeroed workspace; a deterministic run where no staging buffer fits, in turn).
// After the walk, dK and dV leave through K's and V's buffers. bwd_aux.cuh prepares lse and D
// before and converts dQ after.
//
// By role, each a __forceinline__ function or a small struct (every wgmma-issuing call must
// inline: ptxas serialises wgmma across a call, C7510): KeyBlockWork, grid_piece and StepShare
// schedule (which key block, piece and steps a block runs); bwd_producer (TMA loads);
// add_dq_shares (the dQ warp); bwd_consumer's mainloop per step: issue_s_and_dp, bwd_softmax
// (with RowStats), issue_dkv_and_dq, then the dQ share out (add_dq_from_registers or
// stage_dq_share); sum_pieces and bwd_epilogue (dK and dV out) after the walk.
#pragma once

#include <utility>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashgen/common/block_order.cuh"
#include "flashgen/common/bulk_reduce.cuh"
#include "flashgen/common/dropout.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"
#include "flashgen/hopper/bwd_aux.cuh"
#include "flashgen/hopper/bwd_traits.cuh"
#include "flashgen/hopper/fragments.cuh"
#include "flashgen/hopper/warpgroup.cuh"

namespace flashgen::hopper {

// Named barriers (0 is __syncthreads): every consumer has written its dS^T; per consumer c and
// staging buffer b (index c x buffers + b, at most 4), the dQ share is staged (full) and the dQ
// warp has read it (empty).
constexpr int kDsWrittenBarrier = 1;
constexpr int kDqFullBarrier = 2;
constexpr int kDqEmptyBarrier = 6;
constexpr int kDqHandoffThreads = 128 + 32;  // a consumer warpgroup and the dQ warp
// After the walk: every consumer is done with K (kKeysRead); consumer c's rows of dV and dK are
// in shared memory (kEpilogue + c).
constexpr int kKeysReadBarrier = 10;
constexpr int kEpilogueBarrier = 11;
// Consumer c adding its dQ share from registers in a deterministic run: the turn is its, then
// every thread has issued its adds (kDqTurnBarrier + c).
constexpr int kDqTurnBarrier = 13;

// The TMA descriptors, one kernel parameter in constant space: loads of Q, dO, K and V, stores
// of a consumer's share of dK and dV.
template <class TmaQ, class TmaK, class TmaKvShare>
struct BwdTmas {
  TmaQ q, dout;
  TmaK k, v;
  TmaKvShare dk, dv;
};

// Where a batch's rows are in the TMA descriptors' (rows, head dim, heads, slots) tensors: a
// dense batch's sequence from row 0 of its own slot; a variable-length batch's (packed: BwdParams'
// q_view_rows and kv_view_rows set) from its first row of the one slot.
__host__ __device__ __forceinline__ int q_view_rows(BwdParams const& p) {
  return p.q_view_rows > 0 ? p.q_view_rows : p.seqlen_q;
}
__host__ __device__ __forceinline__ int kv_view_rows(BwdParams const& p) {
  return p.kv_view_rows > 0 ? p.kv_view_rows : p.seqlen_k;
}
__host__ __device__ __forceinline__ int view_slots(BwdParams const& p) {
  return p.q_view_rows > 0 ? 1 : p.batch;
}

// Which key block, KV head and sequence a thread block owns, and the query blocks it walks. The
// grid is laid out for a dense batch of the longest lengths (seqlen_q, seqlen_k); in a
// variable-length batch the blocks past a shorter sequence's keys have nothing to do (has_keys),
// and a sequence longer than the longest the caller gave is cut to it. The row-padded workspaces
// hold only the sequences' own query blocks (QueryBlockLayout).
template <class Traits, class Mask>
struct KeyBlockWork {
  int n_block, head_kv, batch;
  DenseSeqs seq;  // the sequence's lengths, and where its rows are
  int m_blocks;   // the sequence's query blocks
  QueryBlockLayout<Traits::kBlockM> layout;  // where they are in the workspaces
  Mask mask;

  // block: the thread block's key block in the grid without splits (grid_piece).
  __device__ __forceinline__ KeyBlockWork(BwdParams const& p, bool deterministic, int block)
      : KeyBlockWork(p, decode(p, deterministic, block)) {}
  __device__ __forceinline__ KeyBlockWork(BwdParams const& p, BlockWork work)
      : n_block(work.rank), head_kv(work.batch_head % p.heads_kv),
        batch(work.batch_head / p.heads_kv), seq(cut(p, DenseSeqs(p, batch))),
        m_blocks((seq.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
        layout(QueryBlockLayout<Traits::kBlockM>::of(p, seq)),
        mask(p, batch, seq.seqlen_k, seq.mask_offset) {}
  static __device__ __forceinline__ DenseSeqs cut(BwdParams const& p, DenseSeqs seq) {
    seq.seqlen_q = min(seq.seqlen_q, p.seqlen_q);
    seq.seqlen_k = min(seq.seqlen_k, p.seqlen_k);
    return seq;
  }
  __device__ __forceinline__ bool has_keys() const {
    return n_block * Traits::kBlockN < seq.seqlen_k;
  }
  // The TMA tensors' slot and first row of this sequence (q_view_rows).
  __device__ __forceinline__ int slot() const { return seq.packed ? 0 : batch; }
  __device__ __forceinline__ int q_row0() const { return int(seq.q_start); }
  __device__ __forceinline__ int k_row0() const { return int(seq.k_start); }
  __device__ __forceinline__ int n_blocks() const {
    return (seq.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  }
  // One (batch, KV head) after another, the longest key block first (under a causal mask the
  // first key blocks see the most query blocks), the last (batch, KV head)s interleaved where the
  // host sorts the grid's tail (block_order.cuh). A deterministic run adds dQ in descending
  // key-block order, so it launches the last key block first: a block only ever waits on blocks
  // launched before it.
  static __device__ __forceinline__ BlockWork decode(BwdParams const& p, bool deterministic,
                                                     int block) {
    const int n_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    if (deterministic) return {n_blocks - 1 - block % n_blocks, block / n_blocks};
    return block_work_sorted_tail(block, n_blocks, p.batch * p.heads_kv, p.sorted_tail_blocks);
  }
  // The query blocks that see a key of the block, for each query head of the group. Where every
  // key block walks every query block, each starts its own share of the way in, so that the key
  // blocks of a head, which run together, reach each query block one after another (the first
  // stores dQ's share, and the others need not wait for it: add_dq_shares). A deterministic run
  // does so where a head's key blocks are few beside the SMs (BwdParams.deterministic_rotation:
  // its turns then follow that order, dq_turn), else walks in order.
  __device__ __forceinline__ QueryBlockWalk<Traits::kBlockM, Traits::kBlockN, Mask> walk(
      BwdParams const& p, bool deterministic) const {
    const int group = p.heads / p.heads_kv;
    const bool rotates = !Mask::kHidesKeys && (!deterministic || p.deterministic_rotation);
    const int rotation = rotates ? first_query_block(n_block, n_blocks()) : 0;
    return {mask, n_block, m_blocks, head_kv * group, group, rotation};
  }
  // Where key block n of a head's n_blocks starts its walk: its share of the way in.
  __device__ __forceinline__ int first_query_block(int n, int n_blocks) const {
    return int(int64_t(n) * m_blocks / n_blocks);
  }
  // Offset of (head, m_block)'s first row in the row-padded per-row workspaces.
  __device__ __forceinline__ int64_t stats_row(BwdParams const& /*p*/, int head,
                                               int m_block) const {
    return layout.index(head, m_block) * Traits::kBlockM;
  }
  // A deterministic run's order of dQ adds to a query block. Where the key blocks start their
  // walks their own share of the way in (deterministic_rotation), the order they reach it in:
  // from the last one that starts at or before it, down to key block 0, then down from the last
  // key block, so that in a head's lockstep each adds as it arrives. Else descending key blocks,
  // from the last one that the block's rows (padded to the whole block) see; where the mask skips
  // blocks, the turns count only the key blocks that visit it (the others add nothing, and never
  // run). head_mask: the mask's view for the query block's head.
  __device__ __forceinline__ int dq_turn(BwdParams const& p, Mask const& head_mask,
                                         int m_block) const {
    const int n_blocks = this->n_blocks();
    if (!Mask::kHidesKeys && p.deterministic_rotation) {
      // The last key block whose first query block is at most m_block.
      const int last_started =
          min(n_blocks - 1, int((int64_t(m_block + 1) * n_blocks - 1) / m_blocks));
      return (last_started - n_block + n_blocks) % n_blocks;
    }
    const int end =
        head_mask.template key_block_end<Traits::kBlockN>((m_block + 1) * Traits::kBlockM - 1);
    if constexpr (Mask::kSkipsBlocks) {
      int turn = 0;
      for (int n = n_block + 1; n < end; ++n) {
        turn += visits<Traits::kBlockM, Traits::kBlockN>(head_mask, m_block, n);
      }
      return turn;
    } else {
      return end - 1 - n_block;
    }
  }
};

__device__ __forceinline__ int load_acquire(int const* at) {
  int seen;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(at) : "memory");
  return seen;
}

__device__ __forceinline__ void store_release(int* at, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(at), "r"(value) : "memory");
}

// Sets a deterministic run's dQ turn, or a query block's dQ state, to `value` once this thread's
// bulk copies are in global memory.
__device__ __forceinline__ void pass_turn(int* turn, int value) {
  wait_bulk_writes();
  asm volatile("fence.proxy.async.global;" ::: "memory");
  store_release(turn, value);
}

// Whether this block is the first to reach a query block (its dQ state 0 -> 1), which then
// stores its dQ shares to the workspace and sets the state to 2; every other block waits for
// that before it adds (BwdParams.dq_state). The first holds nothing another block waits on
// meanwhile, so the wait ends.
__device__ __forceinline__ bool first_to_reach(int* state) {
  int seen = load_acquire(state);
  if (seen == 0) {
    seen = atomicCAS(state, 0, 1);
    if (seen == 0) return true;
  }
  while (seen != 2) seen = load_acquire(state);
  asm volatile("fence.proxy.async.global;" ::: "memory");  // the stores, seen by the bulk adds
  return false;
}

// The steps of its walk that a thread block runs: from step `first`, at most `count` of them (a
// whole key block's walk, or a piece's share of a split block's, grid_piece).
struct StepShare {
  int first, count;

  // Piece `piece.piece` of `piece.pieces` of a walk of `steps` steps (only grids whose walks
  // count their steps exactly, those without a mask, are split).
  __device__ __forceinline__ static StepShare of(GridPiece piece, int steps) {
    const int first = piece.piece * steps / piece.pieces;
    return {first, (piece.piece + 1) * steps / piece.pieces - first};
  }
};

// A piece of split key block `split_block`, after its steps: adds this consumer's dK and dV to
// the block's fp32 workspace (BwdParams.dkv_accum, in register order) and counts the piece done.
// Returns true in the piece that counts last, with the block's summed dK and dV now in dk and
// dv; the others are finished. Every consumer thread calls it.
template <class Traits, class Acc>
__device__ __forceinline__ bool sum_pieces(BwdParams const& p, int split_block, int pieces,
                                           int consumer, int thread, Acc& dk, Acc& dv) {
  constexpr int kFloats = decltype(cute::size(dk))::value;  // per thread, of dK (and of dV)
  constexpr int kShareFloats = 128 * kFloats;                // a consumer's dK (and dV)
  static_assert(Traits::kConsumers * 2 * kShareFloats == Traits::kSplitFloats - 1);
  float* const sums = p.dkv_accum + int64_t(split_block) * (Traits::kSplitFloats - 1) +
                      consumer * 2 * kShareFloats + 4 * thread;
  int* const done =
      reinterpret_cast<int*>(p.dkv_accum + int64_t(p.split_blocks) * (Traits::kSplitFloats - 1));
  CUTE_UNROLL
  for (int j = 0; j < kFloats / 4; ++j) {
    reduce_add_f32x4(sums + 4 * 128 * j, dk(4 * j), dk(4 * j + 1), dk(4 * j + 2), dk(4 * j + 3));
    reduce_add_f32x4(sums + kShareFloats + 4 * 128 * j, dv(4 * j), dv(4 * j + 1), dv(4 * j + 2),
                     dv(4 * j + 3));
  }
  __threadfence();  // every thread's adds are visible before the count
  named_sync(kKeysReadBarrier, Traits::kConsumerThreads);
  const bool counts_last = consumer == 0 && thread == 0 &&
                           atomicAdd(done + split_block, 1) == pieces - 1;
  if (!named_sync_or(kKeysReadBarrier, Traits::kConsumerThreads, counts_last)) return false;
  __threadfence();  // and the other pieces' adds before the reads
  CUTE_UNROLL
  for (int j = 0; j < kFloats / 4; ++j) {
    const float4 k = __ldcg(reinterpret_cast<float4 const*>(sums + 4 * 128 * j));
    const float4 v = __ldcg(reinterpret_cast<float4 const*>(sums + kShareFloats + 4 * 128 * j));
    dk(4 * j) = k.x, dk(4 * j + 1) = k.y, dk(4 * j + 2) = k.z, dk(4 * j + 3) = k.w;
    dv(4 * j) = v.x, dv(4 * j + 1) = v.y, dv(4 * j + 2) = v.z, dv(4 * j + 3) = v.w;
  }
  return true;
}

// The dQ warp (warpgroup 0's second warp): walks the steps as the consumers do, and in each adds
// every consumer's staged share of the query block's dQ to the fp32 workspace by one bulk
// reduce-add per piece from its first thread, handing the buffer back after each. The first
// block to reach a query block stores its shares instead (the workspace is not zeroed first), and
// the others add once they have landed (stores_first_dq); a deterministic run's first turn
// stores and each turn after adds: it waits for the query block's turn before a share's first
// piece and passes it on once the share is in global memory. The consumers wait only when all
// their buffers are still queued.
template <class Traits, class Work, class Walk>
__device__ __forceinline__ void add_dq_shares(BwdParams const& p, Work const& work,
                                              Walk const& walk, StepShare share,
                                              float const* staging, bool deterministic) {
  constexpr int kConsumers = Traits::kConsumers;
  const bool first_store = !deterministic && stores_first_dq<Traits>(p);  // by dq_state
  constexpr int kBuffers = Traits::kDqBuffers;
  const bool leader = threadIdx.x % 32 == 0;
  for (int i = 0; i < kBuffers * kConsumers; ++i) {
    named_arrive(kDqEmptyBarrier + i, kDqHandoffThreads);  // the buffers start empty
  }
  int step = 0;
  for (BwdStep at = walk.at_step(work.mask, share.first); !walk.done(at) && step < share.count;
       at = walk.next(work.mask, at), ++step) {
    const int buffer = step % kBuffers;
    const int64_t row = work.stats_row(p, at.head, at.m_block);
    float* const dq_block = p.dq_accum + row * Traits::kHeadDim;
    int* const turns =
        deterministic ? p.dq_semaphore + row / Traits::kBlockM * kConsumers : nullptr;
    const int turn = deterministic && leader
                         ? work.dq_turn(p, work.mask.for_head(at.head), at.m_block)
                         : 0;
    // Whether this block's shares are the query block's first (stored, not added).
    int* const state = first_store ? p.dq_state + row / Traits::kBlockM : nullptr;
    const bool store = leader && (deterministic ? turn == 0 : first_store && first_to_reach(state));
    for (int piece = 0; piece < Traits::kDqPieces; ++piece) {
      for (int c = 0; c < kConsumers; ++c) {
        named_sync(kDqFullBarrier + kBuffers * c + buffer, kDqHandoffThreads);
        if (leader) {
          if (deterministic && piece == 0) {
            while (load_acquire(turns + c) != turn) {
            }
          }
          const int piece_floats = Traits::dq_piece_floats(c);
          float* const to = dq_block + Traits::dq_offset(c) + piece * piece_floats;
          float const* const from =
              staging + Traits::dq_staging_offset(c) + buffer * piece_floats;
          if (store) {
            bulk_store_f32(to, from, piece_floats * 4);
          } else {
            bulk_add_f32(to, from, piece_floats * 4);
          }
        }
      }
      if (leader) wait_bulk_reads();
      __syncwarp();
      // (The last kBuffers steps' arrivals find no consumer waiting; nothing waits on them.)
      for (int c = 0; c < kConsumers; ++c) {
        named_arrive(kDqEmptyBarrier + kBuffers * c + buffer, kDqHandoffThreads);
      }
    }
    if (deterministic && leader) {
      for (int c = 0; c < kConsumers; ++c) pass_turn(turns + c, turn + 1);
    }
    if (store && first_store) pass_turn(state, 2);
  }
}

// A deterministic run's dQ turn that a consumer's thread 0 holds to pass on (the semaphore and
// its next value), released under the consumer's next step's first GEMMs rather than right after
// its adds, where the release would wait for them on the consumer's path.
struct PendingTurn {
  int* turn = nullptr;
  int value = 0;
  __device__ __forceinline__ void release() {
    if (turn != nullptr) store_release(turn, value);
    turn = nullptr;
  }
};

// A consumer's dQ share of query block m_block of `head` into the workspace from its registers
// (BwdTraits::kDqFromRegisters), in register order, by 16-byte reductions. A deterministic run
// (where the traits' memory plan leaves no staging buffer for the dQ warp) waits for the query
// block's turn (each consumer's share of the head dim's columns takes its turns on its own
// semaphore) and stores where the turn is the first (the workspace is not zeroed then); its
// thread 0 then holds the turn in `pass`, the barrier after every thread's adds ordering them
// before its release.
template <class Traits, class Work, class Mask, class Acc>
__device__ __forceinline__ void add_dq_from_registers(BwdParams const& p, Work const& work,
                                                      Mask const& head_mask, int head,
                                                      int m_block, int consumer, int thread,
                                                      Acc const& dq, bool deterministic,
                                                      PendingTurn& pass) {
  constexpr int kGroups = decltype(cute::size(dq))::value / 4;
  const int64_t row = work.stats_row(p, head, m_block);
  float* const share = p.dq_accum + row * Traits::kHeadDim + Traits::dq_offset(consumer) +
                       4 * thread;
  auto add_all = [&](bool store) {
    CUTE_UNROLL
    for (int j = 0; j < kGroups; ++j) {
      float* const at = share + 4 * 128 * j;
      if (store) {
        *reinterpret_cast<float4*>(at) =
            make_float4(dq(4 * j), dq(4 * j + 1), dq(4 * j + 2), dq(4 * j + 3));
      } else {
        reduce_add_f32x4(at, dq(4 * j), dq(4 * j + 1), dq(4 * j + 2), dq(4 * j + 3));
      }
    }
  };
  if (!deterministic) {
    add_all(false);
    return;
  }
  int* const turns = p.dq_semaphore + row / Traits::kBlockM * Traits::kConsumers + consumer;
  int turn = 0;
  if (thread == 0) {
    turn = work.dq_turn(p, head_mask, m_block);
    while (load_acquire(turns) != turn) {
    }
  }
  add_all(named_sync_or(kDqTurnBarrier + consumer, 128, thread == 0 && turn == 0));
  named_sync(kDqTurnBarrier + consumer, 128);
  if (thread == 0) pass = {turns, turn + 1};
}

// A Q or dO ring: warpgroup 0 produces (its first thread loads), the consumers consume.
template <class Ring, class Traits>
__device__ __forceinline__ Ring make_ring(typename Ring::SharedStorage& storage, bool producer,
                                          bool leader) {
  typename Ring::Params params;
  params.transaction_bytes = Traits::kStageBytes;
  params.role = producer ? Ring::ThreadCategory::Producer : Ring::ThreadCategory::Consumer;
  params.is_leader = leader;
  params.num_consumers = Traits::kConsumerThreads;
  return Ring(storage, params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
}

// The shared-memory buffers as tensors, and their transposes (suffix t: the same bytes as
// MN-major operands).
template <class Traits>
struct BwdSmemTensors {
  template <class Layout>
  using View = decltype(cute::make_tensor(
      cute::make_smem_ptr(std::declval<typename Traits::Element*>()), Layout{}));
  View<typename Traits::SmemLayoutKV> sK;    // (BLK_N, HD, 1)
  View<typename Traits::SmemLayoutKV> sV;    // (BLK_N, HD, 1)
  View<typename Traits::SmemLayoutKt> sKt;   // (HD, BLK_N, 1)
  View<typename Traits::SmemLayoutQ> sQ;     // (BLK_M, HD, PIPE)
  View<typename Traits::SmemLayoutQt> sQt;   // (HD, BLK_M, PIPE)
  View<typename Traits::SmemLayoutDo> sdO;   // (BLK_M, HD, PIPE_DO)
  View<typename Traits::SmemLayoutDot> sdOt; // (HD, BLK_M, PIPE_DO)
  View<typename Traits::SmemLayoutDs> sdS;   // (BLK_M, BLK_N, DS_BUFS); P's at 2 and 3
  View<typename Traits::SmemLayoutDst> sdSt; // (BLK_N, BLK_M, DS_BUFS)

  __device__ __forceinline__ explicit BwdSmemTensors(typename Traits::SharedStorage& smem)
      : sK(view<typename Traits::SmemLayoutKV>(smem.k.data())),
        sV(view<typename Traits::SmemLayoutKV>(smem.v.data())),
        sKt(view<typename Traits::SmemLayoutKt>(smem.k.data())),
        sQ(view<typename Traits::SmemLayoutQ>(smem.q.data())),
        sQt(view<typename Traits::SmemLayoutQt>(smem.q.data())),
        sdO(view<typename Traits::SmemLayoutDo>(smem.dout.data())),
        sdOt(view<typename Traits::SmemLayoutDot>(smem.dout.data())),
        sdS(view<typename Traits::SmemLayoutDs>(smem.ds.data())),
        sdSt(view<typename Traits::SmemLayoutDst>(smem.ds.data())) {}

  template <class Layout>
  __device__ __forceinline__ static View<Layout> view(typename Traits::Element* data) {
    return cute::make_tensor(cute::make_smem_ptr(data), Layout{});
  }
};

// K or V of the thread block's key block, (BLK_N, HD), into its buffer s on a barrier of its own.
template <class Traits, class Work, class Tma, class STensor>
__device__ __forceinline__ void load_keys(BwdParams const& p, Work const& work, Tma const& tma,
                                          STensor& s, uint64_t& barrier) {
  using namespace cute;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  TxBarrier::arrive_and_expect_tx(&barrier, Traits::kKVBytes);
  Tensor m = tma.get_tma_tensor(make_shape(kv_view_rows(p), typename Traits::HD{}, p.heads_kv,
                                           view_slots(p)));  // (rows, HD, heads_kv, slots)
  Tensor g = local_tile(
      domain_offset(make_coord(work.k_row0(), _0{}), m(_, _, work.head_kv, work.slot())),
      Shape<typename Traits::BN, typename Traits::HD>{}, make_coord(_, _0{}));  // (BLK_N, HD, n)
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(s),
                                group_modes<0, 2>(g));  // (TMA, n), (TMA, 1)
  copy(tma.with(barrier), tg(_, work.n_block), ts(_, 0));
}

// Query block m_block of `head` from the tma's tensor m, (rows, HD, heads, slots), into the
// ring s, (BLK_M, HD, PIPE), at its next stage, with its rows of the per-row statistic `stats`
// (row-padded, so whole and 16-byte aligned) into stats_stages, (BLK_M, PIPE).
template <class Traits, class Work, class Tma, class GTensor, class STensor, class Pipeline>
__device__ __forceinline__ void load_rows(BwdParams const& p, Work const& work, Tma const& tma,
                                          GTensor const& m, STensor& s, Pipeline& pipeline,
                                          typename Pipeline::PipelineState& state,
                                          float const* stats, float* stats_stages, int head,
                                          int m_block) {
  using namespace cute;
  pipeline.producer_acquire(state);
  auto& barrier = *pipeline.producer_get_barrier(state);
  Tensor g = local_tile(domain_offset(make_coord(work.q_row0(), _0{}), m(_, _, head, work.slot())),
                        Shape<typename Traits::BM, typename Traits::HD>{},
                        make_coord(_, _0{}));  // (BLK_M, HD, m_blocks)
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(s),
                                group_modes<0, 2>(g));  // (TMA, m_blocks), (TMA, PIPE)
  copy(tma.with(barrier), tg(_, m_block), ts(_, state.index()));
  SM90_BULK_COPY_G2S::copy(stats + work.stats_row(p, head, m_block), &barrier,
                           stats_stages + state.index() * Traits::kBlockM, Traits::kBlockM * 4);
  ++state;
}

// The producer (warpgroup 0's first warp; the walk's tests take a warp, its first thread loads):
// K and V once, on barriers of their own, the one the first GEMM needs first with the first
// step's first tile and the other after that tile where the traits say so; then per step the
// query block's Q with its rows' lse and dO with their D, through the two rings.
template <class Traits, class Work, class Walk, class Tmas>
__device__ __forceinline__ void bwd_producer(BwdParams const& p, Tmas const& tmas,
                                             typename Traits::SharedStorage& smem,
                                             Work const& work, Walk const& walk,
                                             StepShare share,
                                             typename Traits::PipelineQ& pipeline_q,
                                             typename Traits::PipelineDo& pipeline_do) {
  using namespace cute;
  using HD = typename Traits::HD;
  const bool producer_thread = threadIdx.x == 0;
  const BwdSmemTensors<Traits> buffers(smem);
  auto load_second_keys = [&] {
    if constexpr (Traits::kDoFirst) {
      load_keys<Traits>(p, work, tmas.k, buffers.sK, smem.k_full);
    } else {
      load_keys<Traits>(p, work, tmas.v, buffers.sV, smem.v_full);
    }
  };
  if (producer_thread) {
    if constexpr (Traits::kDoFirst) {
      load_keys<Traits>(p, work, tmas.v, buffers.sV, smem.v_full);
    } else {
      load_keys<Traits>(p, work, tmas.k, buffers.sK, smem.k_full);
    }
    if constexpr (!Traits::kSecondKeysLate) load_second_keys();
  }

  // (rows, HD, heads, slots) of the TMA views
  Tensor mQ = tmas.q.get_tma_tensor(make_shape(q_view_rows(p), HD{}, p.heads, view_slots(p)));
  Tensor mdO = tmas.dout.get_tma_tensor(
      make_shape(q_view_rows(p), HD{}, p.heads, view_slots(p)));  // (rows, HD, heads, slots)
  auto q_state = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
  auto do_state = cutlass::make_producer_start_state<typename Traits::PipelineDo>();
  int step = 0;
  for (BwdStep at = walk.at_step(work.mask, share.first); !walk.done(at) && step < share.count;
       at = walk.next(work.mask, at), ++step) {
    if (producer_thread) {
      auto load_q = [&] {
        load_rows<Traits>(p, work, tmas.q, mQ, buffers.sQ, pipeline_q, q_state, p.softmax_lse_log2,
                          smem.lse_log2, at.head, at.m_block);
      };
      auto load_do = [&] {
        load_rows<Traits>(p, work, tmas.dout, mdO, buffers.sdO, pipeline_do, do_state, p.softmax_d,
                          smem.d, at.head, at.m_block);
      };
      if constexpr (Traits::kDoFirst) {
        load_do();
        if (Traits::kSecondKeysLate && step == 0) load_second_keys();
        load_q();
      } else {
        load_q();
        if (Traits::kSecondKeysLate && step == 0) load_second_keys();
        load_do();
      }
    }
  }
}

// This thread's query rows' lse_log2 (from the Q stage) and D (the dO stage), one per column of
// its S^T accumulator: read into registers ahead of use where the tile leaves room for them, so
// that their latency hides under a GEMM, else from shared memory where used. coords: (key, query
// row) of each accumulator register, (rows, kQueryCols).
template <bool kInRegisters, class Coords>
struct RowStats {
  static constexpr int kQueryCols = decltype(cute::size<1>(std::declval<Coords const&>()))::value;
  Coords const coords;
  float const* lse_stage;  // (BLK_M) of the Q stage, from this consumer's first row
  float const* d_stage;    // (BLK_M) of the dO stage, likewise
  float lse_regs[kQueryCols];
  float d_regs[kQueryCols];

  __device__ __forceinline__ RowStats(Coords const& coords, float const* lse_stage,
                                      float const* d_stage)
      : coords(coords), lse_stage(lse_stage), d_stage(d_stage) {}

  // The query row of accumulator column c.
  __device__ __forceinline__ int row(int c) const { return cute::get<1>(coords(0, c)); }
  __device__ __forceinline__ void read_lse() {
    if constexpr (kInRegisters) {
      CUTE_UNROLL
      for (int c = 0; c < kQueryCols; ++c) lse_regs[c] = lse_stage[row(c)];
    }
  }
  __device__ __forceinline__ void read_d() {
    if constexpr (kInRegisters) {
      CUTE_UNROLL
      for (int c = 0; c < kQueryCols; ++c) d_regs[c] = d_stage[row(c)];
    }
  }
  __device__ __forceinline__ float lse_log2(int c) const {
    if constexpr (kInRegisters) return lse_regs[c];
    else return lse_stage[row(c)];
  }
  __device__ __forceinline__ float d(int c) const {
    if constexpr (kInRegisters) return d_regs[c];
    else return d_stage[row(c)];
  }
};

// S^T = K Q^T and dP^T = V dO^T of one step, issued once their tiles have landed (dP^T's first
// with one Q stage, kDoFirst), lse read under the first. The second of K and V arrives under the
// first step's first GEMM where the traits load it late. tSrK, tSrV: (MMA, MMA_M, MMA_K); tSrQ,
// tSrdO: (MMA, MMA_N, MMA_K, PIPE) descriptors; tSrS, tSrdP: (MMA, MMA_M, MMA_N) fp32.
template <class Traits, class Mma, class FragK, class FragQ, class FragDo, class Acc, class Stats>
__device__ __forceinline__ void issue_s_and_dp(
    typename Traits::SharedStorage& smem, int step, typename Traits::PipelineQ& pipeline_q,
    typename Traits::PipelineQ::PipelineState const& q_state,
    typename Traits::PipelineDo& pipeline_do,
    typename Traits::PipelineDo::PipelineState const& do_state, Mma& mma, FragK const& tSrK,
    FragK const& tSrV, FragQ const& tSrQ, FragDo const& tSrdO, Acc& tSrS, Acc& tSrdP,
    Stats& stats) {
  using namespace cute;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  if constexpr (Traits::kDoFirst) {
    pipeline_do.consumer_wait(do_state);
    warpgroup_gemm<true>(mma, tSrV, tSrdO(_, _, _, do_state.index()), tSrdP);
    pipeline_q.consumer_wait(q_state);
    if (Traits::kSecondKeysLate && step == 0) TxBarrier::wait(&smem.k_full, 0);
    warpgroup_gemm<true>(mma, tSrK, tSrQ(_, _, _, q_state.index()), tSrS);
    stats.read_lse();
  } else {
    pipeline_q.consumer_wait(q_state);
    warpgroup_gemm<true>(mma, tSrK, tSrQ(_, _, _, q_state.index()), tSrS);
    stats.read_lse();
    pipeline_do.consumer_wait(do_state);
    if (Traits::kSecondKeysLate && step == 0) TxBarrier::wait(&smem.v_full, 0);
    warpgroup_gemm<true>(mma, tSrV, tSrdO(_, _, _, do_state.index()), tSrdP);
  }
}

// The backward's softmax on one step's S^T and dP^T, (MMA, MMA_M, MMA_N) fp32 with keys as rows
// and query rows as columns (tScS: their (key, row) in the step's tile, from key0 and row0): the
// score modifier and the mask on S^T, then P^T = exp2(S^T * scale_log2 - lse_log2) per query row
// and dS^T = P^T (dP^T - D), times the modifier's derivative, in place; masked scores are -inf,
// and a padded row's lse_log2 +inf, so both give P = 0. Where the modifier's derivative is 1
// (none, ALiBi) and dP^T's GEMM went second, P is computed while dP^T is still on the tensor
// cores (the caller waited for S^T's only); otherwise P waits for dP^T, so the modified scores
// need no registers of their own (the derivative is a function of them). Under dropout (keep
// mask Z, kept ones scaled by 1 / (1 - p)) P^T's place gets Z P^T for dV and dS^T = P^T (Z dP^T
// - D).
template <class Traits, class Mask, class ScoreMod, class Dropout, class Acc, class Coords,
          class Stats>
__device__ __forceinline__ void bwd_softmax(BwdParams const& p, Mask const& mask,
                                            ScoreMod const& score_mod, Dropout const& dropout,
                                            int m_block, int n_block, int row0, int key0,
                                            Acc& tSrS, Acc& tSrdP, Coords const& tScS,
                                            Stats& stats) {
  using namespace cute;
  if constexpr (!ScoreMod::kIdentity) {
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      tSrS(i) = score_mod.apply(tSrS(i), row0 + get<1>(tScS(i)), key0 + get<0>(tScS(i)));
    }
  }
  if (mask.template tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(m_block, n_block)) {
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      const int key = key0 + get<0>(tScS(i));
      const int row = row0 + get<1>(tScS(i));
      if (!mask.visible(row, key)) tSrS(i) = -INFINITY;
    }
  }
  Tensor s = make_tensor(tSrS.data(), rows_by_cols(tSrS.layout()));    // (keys, query cols)
  Tensor dp = make_tensor(tSrdP.data(), rows_by_cols(tSrdP.layout()));  // (keys, query cols)
  auto const& coords = stats.coords;                                     // (keys, query cols)
  constexpr int kQueryCols = Stats::kQueryCols;
  auto prob = [&](float score, int c) {
    return exp2f(fmaf(score, p.scale_log2, -stats.lse_log2(c)));
  };
  // One score's P^T and dS^T from s (P^T already, or the modified score) and dP^T, at (r, c).
  auto p_and_ds = [&](int r, int c, bool keep) {
    float derivative = 1.f;
    if constexpr (!ScoreMod::kUnitDerivative) {
      derivative = score_mod.derivative(s(r, c), row0 + stats.row(c), key0 + get<0>(coords(r, c)));
      s(r, c) = prob(s(r, c), c);
    }
    float dprob = dp(r, c);
    if constexpr (Dropout::kEnabled) dprob = keep ? dprob * dropout.scale : 0.f;
    dp(r, c) = s(r, c) * (dprob - stats.d(c)) * derivative;
    if constexpr (Dropout::kEnabled) s(r, c) = keep ? s(r, c) * dropout.scale : 0.f;
  };
  if constexpr (ScoreMod::kUnitDerivative) {
    CUTE_UNROLL
    for (int c = 0; c < kQueryCols; ++c) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s); ++r) s(r, c) = prob(s(r, c), c);
    }
  }
  stats.read_d();
  warpgroup_wait<0>();
  if constexpr (Dropout::kEnabled) {
    for_each_dropout_decision_transposed(dropout, coords, key0, row0, p_and_ds);
  } else {
    CUTE_UNROLL
    for (int c = 0; c < kQueryCols; ++c) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s); ++r) p_and_ds(r, c, true);
    }
  }
}

// A consumer's dQ share of one step, acc (MMA, MMA_M, MMA_N) fp32, into its staging buffer
// dq_buffer (of those from dq_staging) for the dQ warp, piece by piece, each once the dQ warp
// has read what the buffer held; in register order, the layout bwd_aux.cuh converts from.
template <class Traits, class Acc>
__device__ __forceinline__ void stage_dq_share(Acc const& acc, float* dq_staging, int dq_buffer,
                                               int consumer, int thread) {
  constexpr int kDqBuffers = Traits::kDqBuffers;
  constexpr int kPieceGroups = decltype(cute::size(acc))::value / 4 / Traits::kDqPieces;
  float* const dq_staged = dq_staging + dq_buffer * kPieceGroups * 4 * 128;
  CUTE_UNROLL
  for (int piece = 0; piece < Traits::kDqPieces; ++piece) {
    named_sync(kDqEmptyBarrier + kDqBuffers * consumer + dq_buffer, kDqHandoffThreads);
    CUTE_UNROLL
    for (int j = 0; j < kPieceGroups; ++j) {
      const int r = 4 * (piece * kPieceGroups + j);
      reinterpret_cast<float4*>(dq_staged)[j * 128 + thread] =
          make_float4(acc(r), acc(r + 1), acc(r + 2), acc(r + 3));
    }
    fence_for_bulk_copies();
    named_arrive(kDqFullBarrier + kDqBuffers * consumer + dq_buffer, kDqHandoffThreads);
  }
}

// The GEMMs of one step after the softmax: dV += P^T dO, dK += dS^T Q and dQ's share, dS K (or
// dQ^T = K^T dS^T). dS^T (tSrdS, its 16 bits; and split by the head dim P^T, tSrP) goes to this
// step's dS buffer by stmatrix first, then dV's GEMM issues (P^T and dS^T from registers), so
// that the stores have landed by the proxy fence after it (issued after the GEMMs, they hold the
// fence). The dropout kernel with a transposed dQ share (kBlockM = 80) issues dV's GEMM first and
// lets it retire before dQ^T's issues: with the stores first it spills more. Split by the head
// dim, P^T goes to this step's P buffer too, and dV's and dK's GEMMs wait for every consumer's
// columns. The other buffers' last readers, the previous step's GEMMs, are done in every
// consumer: each waited for them before writing this step's. Returns with dK's GEMM (kDqBeforeDk)
// still in flight.
// tdVrP, tdKrdS: (MMA, MMA_M, MMA_K), or split by the head dim descriptors (..., DS_BUFS);
// tdVrdO, tdKrQ: (MMA, MMA_N, MMA_K, PIPE) descriptors; tdVrdV, tdKrdK: (MMA, MMA_M, MMA_N) fp32;
// dq (and dq2, the second consumer's share where the shares differ): (its K operand, its dS
// operand, its fp32 accumulator), as dq_operands makes them.
template <class Traits, class Dropout, class StoreDs, class FragDsStore, class SDs,
          class MmaDkv, class FragP, class FragDo, class AccKv, class FragDs, class FragQ,
          class MmaDq, class DqOperands, class MmaDq2, class DqOperands2>
__device__ __forceinline__ void issue_dkv_and_dq(
    int consumer, int ds_buffer, int q_stage, int do_stage, StoreDs const& store_ds,
    FragDsStore const& tdSrdS_store, FragDsStore const& tdSrP_store, SDs const& tdSsdS,
    MmaDkv& mma_dkv, FragP const& tdVrP, FragDo const& tdVrdO, AccKv& tdVrdV,
    FragDs const& tdKrdS, FragQ const& tdKrQ, AccKv& tdKrdK, MmaDq& mma_dq, DqOperands& dq,
    MmaDq2& mma_dq_second, DqOperands2& dq2) {
  using namespace cute;
  constexpr bool kSplitHeadDim = Traits::kSplitHeadDim;
  auto issue_dv = [&] {
    if constexpr (kSplitHeadDim) {
      warpgroup_gemm<false>(mma_dkv, tdVrP(_, _, _, 2 + ds_buffer), tdVrdO(_, _, _, do_stage),
                            tdVrdV);
    } else {
      warpgroup_gemm<false>(mma_dkv, tdVrP, tdVrdO(_, _, _, do_stage), tdVrdV);
    }
  };
  auto issue_dk = [&] {
    if constexpr (kSplitHeadDim) {
      warpgroup_gemm<false>(mma_dkv, tdKrdS(_, _, _, ds_buffer), tdKrQ(_, _, _, q_stage), tdKrdK);
    } else {
      warpgroup_gemm<false>(mma_dkv, tdKrdS, tdKrQ(_, _, _, q_stage), tdKrdK);
    }
  };
  auto issue_dkv = [&] {
    issue_dv();
    if constexpr (!Traits::kDqBeforeDk) issue_dk();
  };
  constexpr bool kDvFirst = Traits::kDqTransposed && Dropout::kEnabled;
  if constexpr (!kSplitHeadDim && kDvFirst) issue_dkv();
  copy(store_ds, tdSrdS_store, tdSsdS(_, _, _, ds_buffer));
  if constexpr (kSplitHeadDim) copy(store_ds, tdSrP_store, tdSsdS(_, _, _, 2 + ds_buffer));
  if constexpr (!kSplitHeadDim && !kDvFirst) issue_dkv();
  cutlass::arch::fence_view_async_shared();
  named_sync(kDsWrittenBarrier, Traits::kConsumerThreads);
  if constexpr (kSplitHeadDim) issue_dkv();
  auto& [tdQrK, tdQrdS, tdQrdQ] = dq;
  if constexpr (Traits::kDqTransposed) {
    // dQ^T's GEMM queues behind dV's. In the dropout kernel dV's retires first, which frees
    // P^T: a transposed share beside P^T, dS^T and dV's GEMM in flight makes it spill more.
    if constexpr (kDvFirst) warpgroup_wait<Traits::kDqBeforeDk ? 0 : 1>();
    warpgroup_gemm<true>(mma_dq, tdQrK(_, _, _, 0), tdQrdS(_, _, _, ds_buffer), tdQrdQ);
  } else if (Traits::kDqUneven && consumer != 0) {
    auto& [tdQrK2, tdQrdS2, tdQrdQ2] = dq2;
    warpgroup_gemm<true>(mma_dq_second, tdQrdS2(_, _, _, ds_buffer), tdQrK2(_, _, _, 0),
                         tdQrdQ2);
  } else {
    warpgroup_gemm<true>(mma_dq, tdQrdS(_, _, _, ds_buffer), tdQrK(_, _, _, 0), tdQrdQ);
  }
  if constexpr (Traits::kDqBeforeDk) {
    issue_dk();
    warpgroup_wait<1>();
  } else {
    warpgroup_wait<0>();
  }
  warpgroup_fence_operand(tdQrdQ);
  if constexpr (Traits::kDqUneven) warpgroup_fence_operand(get<2>(dq2));
}

// The epilogue: dK (scaled: S was softmax_scale * Q K^T) and dV, (MMA, MMA_M, MMA_N) fp32:
// registers -> 16 bits -> this consumer's rows of K's and V's buffers by stmatrix -> global by
// one TMA store each (which drops the rows past the sequence), issued by the consumer's first
// thread, or (the traits' kStoreKvByTma unset, and a packed sequence's partial last block) in
// 16-byte pieces, a warp's 32 covering whole rows, the keys inside the sequence (the gradients'
// rows are 16-byte aligned: whole head dims of a fresh tensor). Stores straight from the
// accumulators would be 4 bytes each, rows apart, queued on the load/store unit.
template <class Traits, class Work, class Tmas, class MmaDkv, class AccKv>
__device__ __forceinline__ void bwd_epilogue(BwdParams const& p, Tmas const& tmas,
                                             typename Traits::SharedStorage& smem,
                                             Work const& work, int consumer, int thread,
                                             int key0, int key_share, int row_share,
                                             MmaDkv& mma_dkv, AccKv const& tdKrdK,
                                             AccKv const& tdVrdV) {
  using namespace cute;
  using Element = typename Traits::Element;
  using HD = typename Traits::HD;
  using KvCols = typename Traits::KvCols;
  const BwdSmemTensors<Traits> buffers(smem);
  auto store_kv = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
  auto thr_store_kv = store_kv.get_thread_slice(thread);
  Tensor tdKVrOut = make_tensor<Element>(tdVrdV.layout());  // (MMA, MMA_M, MMA_N)
  // This consumer's keys and head-dim columns of K's or V's buffer, (64, KV_COLS).
  auto own_share = [&](auto const& s) {
    return local_tile(s(_, _, 0), Shape<_64, KvCols>{}, make_coord(key_share, row_share));
  };
  auto stage = [&](auto const& acc, auto const& s, float scale) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) tdKVrOut(i) = Element(acc(i) * scale);
    copy(store_kv, thr_store_kv.retile_S(tdKVrOut), thr_store_kv.partition_D(own_share(s)));
  };
  // V's rows: split by keys, only this consumer's dP^T GEMMs read them, and they are complete;
  // K's rows, and split by the head dim V's too: every consumer's GEMMs read all of them.
  if constexpr (!Traits::kSplitHeadDim) stage(tdVrdV, buffers.sV, 1.f);
  named_sync(kKeysReadBarrier, Traits::kConsumerThreads);
  if constexpr (Traits::kSplitHeadDim) stage(tdVrdV, buffers.sV, 1.f);
  stage(tdKrdK, buffers.sK, p.softmax_scale);
  // A packed sequence's partial last key block stores by thread: a TMA store would write the
  // rows past the sequence, the next sequence's.
  if constexpr (Traits::kStoreKvByTma) {
    if (!work.seq.packed || (work.n_block + 1) * Traits::kBlockN <= work.seq.seqlen_k) {
      cutlass::arch::fence_view_async_shared();  // the stmatrix writes, seen by the TMA stores
      named_sync(kEpilogueBarrier + consumer, 128);
      if (thread == 0) {
        auto store = [&](auto const& tma, auto const& s) {
          Tensor m = tma.get_tma_tensor(
              make_shape(kv_view_rows(p), HD{}, p.heads_kv, view_slots(p)));  // (rows, HD, ...)
          Tensor g = local_tile(
              domain_offset(make_coord(work.k_row0(), _0{}), m(_, _, work.head_kv, work.slot())),
              Shape<_64, KvCols>{}, make_coord(_, _));  // (64, KV_COLS, key slabs, col shares)
          auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{},
                                        group_modes<0, 2>(own_share(s)),
                                        group_modes<0, 2>(g));  // (TMA, slabs, shares), (TMA)
          copy(tma, ts, tg(_, key0 / 64, row_share));
        };
        store(tmas.dv, buffers.sV);
        store(tmas.dk, buffers.sK);
        tma_store_arrive();
        tma_store_wait<0>();  // the buffers are read before the block exits
      }
      return;
    }
  }
  named_sync(kEpilogueBarrier + consumer, 128);
  auto store = [&](auto const& s, void* base, int64_t batch_stride, int64_t row_stride,
                   int64_t head_stride) {
    Tensor share = own_share(s);  // (64, KV_COLS)
    Element* out = static_cast<Element*>(base) +
                   work.seq.k_offset(batch_stride, row_stride, head_stride, work.head_kv) +
                   Traits::kKvCols * row_share;
    constexpr int kPiecesPerRow = Traits::kKvCols / 8;
    CUTE_UNROLL
    for (int i = thread; i < 64 * kPiecesPerRow; i += 128) {
      const int row = i / kPiecesPerRow, col = i % kPiecesPerRow * 8;
      if (key0 + row < work.seq.seqlen_k) {
        *reinterpret_cast<uint4*>(out + int64_t(key0 + row) * row_stride + col) =
            *reinterpret_cast<uint4 const*>(&share(row, col));
      }
    }
  };
  store(buffers.sV, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  store(buffers.sK, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
}

// S^T's and dP^T's operands over a consumer's keys (key_share) and query rows (row_share), as
// descriptors: K's and V's, (MMA, MMA_M, MMA_K); Q's and dO's, (MMA, MMA_N, MMA_K, PIPE).
template <class Traits, class ThrMma, class Smem>
__device__ __forceinline__ auto sdp_operands(ThrMma const& thr, Smem const& s, int key_share,
                                             int row_share) {
  using namespace cute;
  using HD = typename Traits::HD;
  auto own_keys = [&](auto const& t) {  // (64, HD)
    return local_tile(t(_, _, 0), Shape<_64, HD>{}, make_coord(key_share, _0{}));
  };
  auto own_rows = [&](auto const& t) {  // (ROWS, HD, stages)
    return local_tile(t, make_shape(typename Traits::Rows{}, HD{}, size<2>(t)),
                      make_coord(row_share, _0{}, _0{}));
  };
  return make_tuple(thr.partition_fragment_A(own_keys(s.sK)),
                    thr.partition_fragment_A(own_keys(s.sV)),
                    thr.partition_fragment_B(own_rows(s.sQ)),
                    thr.partition_fragment_B(own_rows(s.sdO)));
}

// dV's and dK's operands: P^T's and dS^T's (tSrP, tSrdS: (MMA, MMA_M, MMA_N) in 16 bits) as A
// operands from registers, (MMA, MMA_M, MMA_K), or split by the head dim from the P and dS
// buffers (descriptors, (MMA, MMA_M, MMA_K, DS_BUFS)); dO^T's and Q^T's over the consumer's
// head-dim columns (row_share), descriptors (MMA, MMA_N, MMA_K, PIPE).
template <class Traits, class ThrMma, class Smem, class Frag>
__device__ __forceinline__ auto dkv_operands(ThrMma const& thr, Smem const& s, Frag& tSrP,
                                             Frag& tSrdS, int row_share) {
  using namespace cute;
  auto own_cols = [&](auto const& t) {  // (KV_COLS, BLK_M, stages)
    return local_tile(t, make_shape(typename Traits::KvCols{}, typename Traits::BM{}, size<2>(t)),
                      make_coord(row_share, _0{}, _0{}));
  };
  if constexpr (Traits::kSplitHeadDim) {
    return make_tuple(thr.partition_fragment_A(s.sdSt), thr.partition_fragment_A(s.sdSt),
                      thr.partition_fragment_B(own_cols(s.sdOt)),
                      thr.partition_fragment_B(own_cols(s.sQt)));
  } else {
    return make_tuple(make_tensor(tSrP.data(), acc_as_a_operand(tSrP.layout())),
                      make_tensor(tSrdS.data(), acc_as_a_operand(tSrdS.layout())),
                      thr.partition_fragment_B(own_cols(s.sdOt)),
                      thr.partition_fragment_B(own_cols(s.sQt)));
  }
}

// A consumer's rows of dS^T in shared memory (the dS buffers' transposed view), written by
// stmatrix: a key's 8 consecutive query rows are 16 contiguous bytes there (transposed: a query
// row's 8 consecutive keys). (Element-wise stores through the swizzled view lose the shared
// address space: generic stores with 64-bit address arithmetic.) The swizzle applies to the
// offset within the buffers, whose base is aligned to its period, not to the pointer: a thread's
// stores of a step are then one shared address plus immediates, where the pointer's swizzle
// rebuilt each address every step in 64-bit arithmetic. Returns the thread's slice of the
// buffers, (STSM, STSM_M, STSM_N, DS_BUFS).
template <class Traits, class ThrCopy, class Smem>
__device__ __forceinline__ auto ds_store_destination(ThrCopy const& thr, Smem const& s,
                                                     int key_share, int row_share) {
  using namespace cute;
  return thr.partition_D(local_tile(
      as_position_independent_swizzle_tensor(s.sdSt),
      Shape<_64, typename Traits::Rows, typename Traits::DsBuffers>{},
      make_coord(key_share, row_share, _0{})));
}

// The operands of a dQ share of `cols` columns from first_col (a multiple of it): dS (its rows,
// those of sdSShare, (DQ_ROWS, BLK_N, DS_BUFS)) times K (its columns), or its transpose, K^T's
// rows (the share's columns) times dS^T. Returns (K's, dS's, the accumulator): descriptors
// (MMA, MMA_M or MMA_N, MMA_K, 1) and (..., DS_BUFS), and fp32 (MMA, MMA_M, MMA_N).
template <class Traits, class Mma, class Cols, class Smem, class SShare>
__device__ __forceinline__ auto dq_operands(Mma const& mma, Cols, int first_col, int thread,
                                            Smem const& s, SShare const& sdSShare) {
  using namespace cute;
  using DqRows = Int<Traits::kDqRows>;
  auto thr = mma.get_thread_slice(thread);
  Tensor sKtShare = local_tile(s.sKt, Shape<Cols, typename Traits::BN, _1>{},
                               make_coord(first_col / Cols::value, _0{}, _0{}));  // (COLS, BLK_N)
  if constexpr (Traits::kDqTransposed) {
    return make_tuple(thr.partition_fragment_A(sKtShare), thr.partition_fragment_B(sdSShare),
                      partition_fragment_C(mma, Shape<Cols, DqRows>{}));
  } else {
    return make_tuple(thr.partition_fragment_B(sKtShare), thr.partition_fragment_A(sdSShare),
                      partition_fragment_C(mma, Shape<DqRows, Cols>{}));
  }
}

// A consumer warpgroup: keys [64 c, 64 c + 64) of the block, or (split by the head dim) all 64
// keys, query rows [kRows c, kRows c + kRows) and head-dim columns [kKvCols c, kKvCols c +
// kKvCols). Its mainloop walks the steps: S^T and dP^T (issue_s_and_dp), the softmax
// (bwd_softmax), dV, dK and dQ's share (issue_dkv_and_dq), the share to the workspace (from
// registers, or staged for the dQ warp); then a split block's pieces sum dK and dV, and the
// epilogue stores them.
template <class Traits, class Mask, class ScoreMod, class Dropout, class Tmas, class Work,
          class Walk>
__device__ __forceinline__ void bwd_consumer(
    BwdParams const& p, Tmas const& tmas, typename Traits::SharedStorage& smem, Work const& work,
    Walk const& walk, StepShare share, GridPiece piece, int split_block, bool deterministic,
    bool dq_from_registers, int consumer, typename Traits::PipelineQ& pipeline_q,
    typename Traits::PipelineDo& pipeline_do) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using KvCols = typename Traits::KvCols;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr bool kSplitHeadDim = Traits::kSplitHeadDim;
  constexpr bool kDqUneven = Traits::kDqUneven;
  constexpr int kDqBuffers = Traits::kDqBuffers;
  const int thread = threadIdx.x % 128;
  const int key_share = kSplitHeadDim ? 0 : consumer;  // which 64 keys, rows or columns it owns
  const int row_share = kSplitHeadDim ? consumer : 0;
  const BwdSmemTensors<Traits> buffers(smem);

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDkv mma_dkv;
  typename Traits::TiledMmaDq mma_dq;
  typename Traits::TiledMmaDqSecond mma_dq_second;
  auto thr_sdp = mma_sdp.get_thread_slice(thread);
  // (MMA, MMA_M, MMA_K) x 2, (MMA, MMA_N, MMA_K, PIPE) x 2: descriptors
  auto [tSrK, tSrV, tSrQ, tSrdO] = sdp_operands<Traits>(thr_sdp, buffers, key_share, row_share);
  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<_64, Rows>{});   // (MMA, MMA_M, MMA_N)
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<_64, Rows>{});  // (MMA, MMA_M, MMA_N)
  // (MMA, MMA_M, MMA_N) -> (key, query row) in the step's tile
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<_64, Rows>{}));
  // tScS as (key, query row) rows and columns: each of its columns is one query row of the block.
  Tensor coords = make_tensor(tScS.data(), rows_by_cols(tScS.layout()));  // (keys, query cols)
  // Not beside a modifier whose derivative is not 1 (P^T is computed after dP^T's GEMM then,
  // beside its accumulator) nor beside dropout's random bits: they spill.
  constexpr bool kStatsInRegisters =
      Traits::kRowStatsInRegisters && ScoreMod::kUnitDerivative && !Dropout::kEnabled;
  Tensor tSrP = make_tensor<Element>(tSrS.layout());   // (MMA, MMA_M, MMA_N)
  Tensor tSrdS = make_tensor<Element>(tSrS.layout());  // (MMA, MMA_M, MMA_N)
  // (MMA, MMA_M, MMA_K) x 2, from registers or descriptors (..., DS_BUFS); (MMA, MMA_N, MMA_K,
  // PIPE) x 2, descriptors
  auto [tdVrP, tdKrdS, tdVrdO, tdKrQ] =
      dkv_operands<Traits>(mma_dkv.get_thread_slice(thread), buffers, tSrP, tSrdS, row_share);
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<_64, KvCols>{});  // (MMA, MMA_M, MMA_N)
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<_64, KvCols>{});  // (MMA, MMA_M, MMA_N)
  auto store_ds =
      make_tiled_copy_C(Copy_Atom<typename Traits::DsStoreAtom, Element>{}, mma_sdp);
  auto thr_store_ds = store_ds.get_thread_slice(thread);
  // (STSM, STSM_M, STSM_N, DS_BUFS)
  Tensor tdSsdS = ds_store_destination<Traits>(thr_store_ds, buffers, key_share, row_share);
  Tensor tdSrdS_store = thr_store_ds.retile_S(tSrdS);  // (STSM, STSM_M, STSM_N)
  Tensor tdSrP_store = thr_store_ds.retile_S(tSrP);    // (STSM, STSM_M, STSM_N)
  // (DQ_ROWS, BLK_N, DS_BUFS): the dS rows of this consumer's dQ share
  Tensor sdSShare = local_tile(buffers.sdS, Shape<Int<Traits::kDqRows>, typename Traits::BN,
                                            typename Traits::DsBuffers>{},
                               make_coord(Traits::kDqSplitRows ? consumer : 0, _0{}, _0{}));
  // The first consumer's share (every consumer's, where the shares are alike) and, where they
  // differ (kDqUneven), the second's, which only the second consumer computes.
  // (K's, dS's, fp32 accumulator (MMA, MMA_M, MMA_N)), as dq_operands says
  auto dq = dq_operands<Traits>(mma_dq, Int<Traits::kDqCols>{},
                                kDqUneven ? 0 : Traits::dq_first_col(consumer), thread, buffers,
                                sdSShare);
  // (K's, dS's, fp32 accumulator (MMA, MMA_M, MMA_N)), likewise
  auto dq2 = dq_operands<Traits>(mma_dq_second, Int<Traits::dq_cols(Traits::kConsumers - 1)>{},
                                 kDqUneven ? Traits::dq_first_col(1) : 0, thread, buffers,
                                 sdSShare);
  auto& tdQrdQ = get<2>(dq);
  auto& tdQrdQ2 = get<2>(dq2);
  static_assert(decltype(size(tdQrdQ))::value == Traits::dq_floats(0) / 128);
  // This consumer's staging buffers, used in turn (none where the memory plan leaves none): with
  // two, the dQ warp reads one while the next step writes the other.
  float* const dq_staging = smem.dq + Traits::dq_staging_offset(consumer);

  clear(tdVrdV);
  clear(tdKrdK);
  if (walk.has_steps()) {
    TxBarrier::wait(Traits::kDoFirst ? &smem.v_full : &smem.k_full, 0);
    if constexpr (!Traits::kSecondKeysLate) {
      TxBarrier::wait(Traits::kDoFirst ? &smem.k_full : &smem.v_full, 0);
    }
  }
  typename Traits::PipelineQ::PipelineState q_state;
  typename Traits::PipelineDo::PipelineState do_state;
  PendingTurn dq_turn_pending;  // a deterministic run's last dQ turn, from registers
  const int key0 = work.n_block * Traits::kBlockN + key_share * 64;
  int step = 0;
  for (BwdStep at = walk.at_step(work.mask, share.first); !walk.done(at) && step < share.count;
       at = walk.next(work.mask, at), ++step) {
    const int head = at.head;
    const int m_block = at.m_block;
    const int ds_buffer = step & 1;  // P's: 2 + ds_buffer
    const int dq_buffer = step % cute::max(1, kDqBuffers);  // (no staging buffers: 0)
    const Mask mask = work.mask.for_head(head);
    const int share_row = Traits::kRows * row_share;  // this consumer's first query row
    RowStats<kStatsInRegisters, decltype(coords)> stats(
        coords, smem.lse_log2 + q_state.index() * kBlockM + share_row,
        smem.d + do_state.index() * kBlockM + share_row);

    issue_s_and_dp<Traits>(smem, step, pipeline_q, q_state, pipeline_do, do_state, mma_sdp, tSrK,
                           tSrV, tSrQ, tSrdO, tSrS, tSrdP, stats);
    if constexpr (Traits::kDqFromRegisters) dq_turn_pending.release();
    warpgroup_wait<Traits::kDoFirst ? 0 : 1>();
    const int row0 = m_block * kBlockM + share_row;
    const ScoreMod score_mod(p, work.batch, head, work.seq.mask_offset);
    const Dropout dropout(p, work.batch, head);
    bwd_softmax<Traits>(p, mask, score_mod, dropout, m_block, work.n_block, row0, key0, tSrS,
                        tSrdP, tScS, stats);
    convert_into(tSrP, tSrS);
    convert_into(tSrdS, tSrdP);

    issue_dkv_and_dq<Traits, Dropout>(consumer, ds_buffer, q_state.index(), do_state.index(),
                                      store_ds, tdSrdS_store, tdSrP_store, tdSsdS, mma_dkv, tdVrP,
                                      tdVrdO, tdVrdV, tdKrdS, tdKrQ, tdKrdK, mma_dq, dq,
                                      mma_dq_second, dq2);
    pipeline_do.consumer_release(do_state);
    ++do_state;

    // dQ's share -> the workspace (in register order, the layout bwd_aux.cuh converts from):
    // by reductions from registers where the traits say so, else through this step's staging
    // buffer for the dQ warp, which adds it. (Reductions from registers hold each thread at its
    // next memory instruction until the load/store unit has taken them all, which costs more
    // where the adds are fewer.)
    if constexpr (Traits::kDqFromRegisters) {
      if (dq_from_registers) {
        add_dq_from_registers<Traits>(p, work, mask, head, m_block, consumer, thread, tdQrdQ,
                                      deterministic, dq_turn_pending);
      }
    }
    if constexpr (kDqBuffers > 0) {
      if (!dq_from_registers) {
        if (kDqUneven && consumer != 0) {
          stage_dq_share<Traits>(tdQrdQ2, dq_staging, dq_buffer, consumer, thread);
        } else {
          stage_dq_share<Traits>(tdQrdQ, dq_staging, dq_buffer, consumer, thread);
        }
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tdKrdK);
    pipeline_q.consumer_release(q_state);
    ++q_state;
  }
  if constexpr (Traits::kDqFromRegisters) dq_turn_pending.release();  // (the walk's last)

  // A split block's pieces sum their dK and dV; the last to finish writes them.
  if (piece.pieces > 1 &&
      !sum_pieces<Traits>(p, split_block, piece.pieces, consumer, thread, tdKrdK, tdVrdV)) {
    return;
  }
  bwd_epilogue<Traits>(p, tmas, smem, work, consumer, thread, key0, key_share, row_share, mma_dkv,
                       tdKrdK, tdVrdV);
}

// Warp specialised: warpgroup 0's first warp produces (bwd_producer) and its second adds the
// consumers' staged dQ shares (add_dq_shares); every other warpgroup consumes (bwd_consumer).
// The tile scheduler is the grid: each thread block owns one key block, or one piece of a split
// one (grid_piece), and walks its query blocks (KeyBlockWork, StepShare).
template <class Traits, class Mask, class ScoreMod, class Dropout, class Tmas>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(CUTE_GRID_CONSTANT BwdParams const p, CUTE_GRID_CONSTANT Tmas const tmas) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_bytes);

  const bool deterministic = p.dq_semaphore != nullptr;
  // Whether the consumers add dQ from registers (BwdTraits::kDqFromRegisters; a deterministic run
  // only where no staging buffer fits), else stage it for the dQ warp.
  const bool dq_from_registers =
      Traits::kDqFromRegisters && (!deterministic || Traits::kDqBuffers == 0);
  const int blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN * p.batch * p.heads_kv;
  const GridPiece piece = grid_piece(int(blockIdx.x), blocks, p.split_blocks, p.splits);
  const KeyBlockWork<Traits, Mask> work(p, deterministic, piece.block);
  if (!work.has_keys()) return;  // past a shorter sequence's keys: no rows to write
  const auto walk = work.walk(p, deterministic);
  const StepShare share = StepShare::of(piece, walk.steps_at_most());

  const int warpgroup = cutlass::canonical_warp_group_idx();
  const bool producer_thread = threadIdx.x == 0;
  auto pipeline_q = make_ring<typename Traits::PipelineQ, Traits>(smem.pipeline_q,
                                                                  warpgroup == 0, producer_thread);
  auto pipeline_do = make_ring<typename Traits::PipelineDo, Traits>(
      smem.pipeline_do, warpgroup == 0, producer_thread);
  if (producer_thread) {
    TxBarrier::init(&smem.k_full, 1);
    TxBarrier::init(&smem.v_full, 1);
    prefetch_tma_descriptors(tmas.q, tmas.dout, tmas.k, tmas.v);
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (warp > 1 || !walk.has_steps()) return;
    if (warp == 1) {
      if constexpr (Traits::kDqBuffers > 0) {
        if (!dq_from_registers) {
          add_dq_shares<Traits>(p, work, walk, share, smem.dq, deterministic);
        }
      }
      return;
    }
    bwd_producer<Traits>(p, tmas, smem, work, walk, share, pipeline_q, pipeline_do);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  bwd_consumer<Traits, Mask, ScoreMod, Dropout>(
      p, tmas, smem, work, walk, share, piece, piece.block - (blocks - p.split_blocks),
      deterministic, dq_from_registers, warpgroup - 1, pipeline_q, pipeline_do);
#endif
}

}  // namespace flashgen::hopper
