// The backward kernels (FlashAttention-2 design on mma.sync).
//
// bwd_dkdv_kernel: one thread block per (batch, KV head, block of block_n keys). K and V stay in
// shared memory; the block walks every query block of every query head that shares this KV head
// (GQA: dK and dV come out summed, no expanded copies), Q and dO streaming through a ring of
// q_stages cp.async buffers. dK and dV accumulate in registers. Each step's dQ contribution is
// added to an fp32 workspace with atomics, unless the deterministic path is asked for. A split
// key block (grid_piece) runs as pieces, each a share of its steps, whose dK and dV meet in
// another fp32 workspace; the last piece to finish writes them.
//
// bwd_dq_kernel (deterministic path): one thread block per (batch, head, block of block_m
// queries) walks the key blocks and accumulates dQ in registers, in a fixed order.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/common/block_order.cuh"
#include "flashgen/common/bulk_reduce.cuh"
#include "flashgen/mma/bwd_step.cuh"
#include "flashgen/mma/bwd_traits.cuh"
#include "flashgen/mma/copy.cuh"
#include "flashgen/mma/gemm.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/common/seqinfo.cuh"

namespace flashgen {

using namespace cute;

// Registers -> shared (converted to the input type, times `scale`) -> global with 16-byte
// coalesced stores, rows below `rows` only. The caller has made the shared tile free.
template <class Traits, class TiledMma, class Acc, class Smem, class Gmem>
__device__ __forceinline__ void store_tile(TiledMma const& mma, int tid, Acc const& acc,
                                           float scale, Smem& smem, Gmem& gmem, int rows) {
  using Element = typename Traits::Element;
  Tensor regs = make_tensor_like<Element>(acc);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) regs(i) = Element(acc(i) * scale);
  auto to_smem = make_tiled_copy_C(AccumulatorStoreCopy<Element>{}, mma);
  auto thr_to_smem = to_smem.get_thread_slice(tid);
  copy(to_smem, thr_to_smem.retile_S(regs), thr_to_smem.partition_D(smem));
  __syncthreads();
  typename Traits::Gmem::Store to_gmem;
  auto thr_to_gmem = to_gmem.get_thread_slice(tid);
  auto identity = make_identity_tensor(make_shape(size<0>(smem), size<1>(smem)));  // (row, col)
  copy_tile<false, Traits::kHeadDim>(to_gmem, thr_to_gmem.partition_S(smem),
                                     thr_to_gmem.partition_D(gmem),
                                     thr_to_gmem.partition_S(identity), rows);
}

// acc (an mma accumulator) += into an fp32 (rows, kHeadDimPadded) workspace with atomics, rows
// below `rows` only (kAllRows: the caller knows that every row of the tile is). An accumulator
// holds column pairs (2c, 2c + 1) of a row next to each other: Hopper adds both with one 8-byte
// atomic.
template <int kHeadDim, int kHeadDimPadded, bool kAllRows, class Acc, class Coords>
__device__ __forceinline__ void add_to_workspace(float* workspace, Acc const& acc,
                                                 Coords const& coords, int row0, int rows) {
  static_assert(kHeadDim % 2 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int row = row0 + get<0>(coords(i));
    const int col = get<1>(coords(i));
    if ((kAllRows || row < rows) && (kHeadDim == kHeadDimPadded || col < kHeadDim)) {
      float* address = workspace + int64_t(row) * kHeadDimPadded + col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(address), make_float2(acc(i), acc(i + 1)));
#else
      atomicAdd(address, acc(i));
      atomicAdd(address + 1, acc(i + 1));
#endif
    }
  }
}

// acc = an fp32 (rows, kRowStride) workspace's values at the accumulator's coordinates, read from
// L2 (other thread blocks wrote them).
template <int kRowStride, class Acc, class Coords>
__device__ __forceinline__ void load_from_workspace(Acc& acc, const float* workspace,
                                                    Coords const& coords) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const float* address = workspace + get<0>(coords(i)) * kRowStride + get<1>(coords(i));
    const float2 value = __ldcg(reinterpret_cast<const float2*>(address));
    acc(i) = value.x;
    acc(i + 1) = value.y;
  }
}

// One piece of split key block `split_block`: adds its dK and dV into the block's fp32 workspace
// and counts itself done. Returns true in the piece that counts last, with the block's summed dK
// and dV now in acc_dk and acc_dv; the others are finished.
template <class Traits, class TiledMma, class Acc>
__device__ __forceinline__ bool sum_pieces(const BwdParams& p, int split_block, int pieces,
                                           TiledMma const& mma, int tid, Acc& acc_dk,
                                           Acc& acc_dv) {
  constexpr int kHeadDimPadded = Traits::kHeadDimPadded;
  constexpr int kTileFloats = Traits::kBlockN * kHeadDimPadded;
  float* dk_accum = p.dkv_accum + int64_t(split_block) * 2 * kTileFloats;
  float* dv_accum = dk_accum + kTileFloats;
  int* done = reinterpret_cast<int*>(p.dkv_accum + int64_t(p.split_blocks) * 2 * kTileFloats);
  auto coords = mma.get_thread_slice(tid).partition_C(
      make_identity_tensor(Shape<Int<Traits::kBlockN>, Int<kHeadDimPadded>>{}));
  add_to_workspace<Traits::kHeadDim, kHeadDimPadded, true>(dk_accum, acc_dk, coords, 0, 0);
  add_to_workspace<Traits::kHeadDim, kHeadDimPadded, true>(dv_accum, acc_dv, coords, 0, 0);
  __threadfence();  // every thread's adds are visible before the count
  __syncthreads();
  int last = 0;
  if (tid == 0) last = atomicAdd(done + split_block, 1) == pieces - 1;
  if (!__syncthreads_or(last)) return false;
  __threadfence();  // and the other pieces' adds before the reads
  load_from_workspace<kHeadDimPadded>(acc_dk, dk_accum, coords);
  load_from_workspace<kHeadDimPadded>(acc_dv, dv_accum, coords);
  return true;
}

// acc (an mma accumulator of a (block_m, head_dim) tile) -> the fp32 staging rows, then fenced
// so that the bulk adds issued after the next barrier see them.
template <int kRowStride, class Acc, class Coords>
__device__ __forceinline__ void stage_for_bulk_add(float* staging, Acc const& acc,
                                                   Coords const& coords) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    float* address = staging + get<0>(coords(i)) * kRowStride + get<1>(coords(i));
    *reinterpret_cast<float2*>(address) = make_float2(acc(i), acc(i + 1));
  }
  fence_for_bulk_copies();
}

// Mask, Seqs, ScoreMod, Dropout: as in fwd_kernel.
template <class Traits, class Mask, class Seqs = DenseSeqs, class ScoreMod = IdentityScore,
          class Dropout = NoDropout>
__global__ void __launch_bounds__(Traits::kThreads) bwd_dkdv_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimPadded = Traits::kHeadDimPadded;
  constexpr int kQStages = Traits::kQStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDimPadded>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDimPadded>>;

  extern __shared__ char smem[];
  const int tid = threadIdx.x;

  // Rank r is key block r: under causal masking the first key block sees the most queries.
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const int blocks = num_n_blocks * p.batch * p.heads_kv;
  const GridPiece piece = grid_piece(int(blockIdx.x), blocks, p.split_blocks, p.splits);
  const BlockWork work = block_work_sorted_tail(piece.block, num_n_blocks, p.batch * p.heads_kv,
                                                p.sorted_tail_blocks);
  const int n_block = work.rank;
  const int head_kv = work.batch_head % p.heads_kv;
  const int group = p.heads / p.heads_kv;
  const Seqs seq(p, work.batch_head / p.heads_kv);
  const Mask mask(p, seq.batch, seq.seqlen_k, seq.mask_offset);

  // Query blocks that see a key of this block: those the mask lets see it. Steps run over (query
  // head in the group, query block); none means dK = dV = 0. A piece runs its share of them
  // (grids of masks that hide keys are not split, so the walks of those that skip blocks or
  // differ per head, whose steps are counted only by walking, are never divided).
  const int num_m_blocks = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  const QueryBlockWalk<kBlockM, kBlockN, Mask> walk(mask, n_block, num_m_blocks, head_kv * group,
                                                    group);
  const int steps = walk.steps_at_most();
  const int step_begin = piece.piece * steps / piece.pieces;
  const int step_end = (piece.piece + 1) * steps / piece.pieces;
  const int kv_rows = seq.seqlen_k - n_block * kBlockN;
  // Past a shorter sequence of a variable-length batch (every piece of a split block alike).
  if (kv_rows <= 0) return;

  Tensor gK = local_tile(seq.template k_rows<const Element, kHeadDim>(
                             p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, head_kv),
                         TileKV{}, make_coord(n_block, 0));  // (BLK_N, HDP)
  Tensor gV = local_tile(seq.template k_rows<const Element, kHeadDim>(
                             p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, head_kv),
                         TileKV{}, make_coord(n_block, 0));

  // Shared memory: the Q ring, the dO ring, K, V, P, dS.
  using SmemQ = typename Traits::SmemLayoutQ;
  using SmemK = typename Traits::SmemLayoutK;
  using SmemP = typename Traits::SmemLayoutP;
  // (BLK_M, HDP, S)
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), SmemQ{});
  Tensor sdO = make_tensor(sQ.data() + cosize(SmemQ{}), SmemQ{});
  Tensor sK = make_tensor(sdO.data() + cosize(SmemQ{}), SmemK{});    // (BLK_N, HDP)
  Tensor sV = make_tensor(sK.data() + cosize(SmemK{}), SmemK{});
  Tensor sP = make_tensor(sV.data() + cosize(SmemK{}), SmemP{});     // (BLK_M, BLK_N)
  Tensor sdS = make_tensor(sP.data() + cosize(SmemP{}), SmemP{});
  float* dq_staging = reinterpret_cast<float*>(raw_pointer_cast(sdS.data() + cosize(SmemP{})));
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});    // (HDP, BLK_M, S)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQt{});
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});    // (HDP, BLK_N)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPt{});    // (BLK_N, BLK_M)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPt{});

  typename Traits::Gmem::Load gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));     // (CPY, CPY_M, CPY_K)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));  // (CPY, CPY_N, CPY_K)

  auto load_q_do = [&](BwdStep at, int stage) {
    const int head = at.head;
    const int m_block = at.m_block;
    const int rows = seq.seqlen_q - m_block * kBlockM;
    Tensor gQ = local_tile(seq.template q_rows<const Element, kHeadDim>(
                               p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, head),
                           TileQ{}, make_coord(m_block, 0));
    Tensor gdO = local_tile(seq.template q_rows<const Element, kHeadDim>(
                                p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, head),
                            TileQ{}, make_coord(m_block, 0));
    if (rows >= kBlockM) {  // every block but the last: no row predicates
      copy_all_rows<true, kHeadDim, kHeadDimPadded>(gmem_copy, gmem_thr.partition_S(gQ),
                                                    gmem_thr.partition_D(sQ(_, _, stage)), tQcQ);
      copy_all_rows<true, kHeadDim, kHeadDimPadded>(gmem_copy, gmem_thr.partition_S(gdO),
                                                    gmem_thr.partition_D(sdO(_, _, stage)), tQcQ);
    } else {
      copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gQ),
                                gmem_thr.partition_D(sQ(_, _, stage)), tQcQ, rows);
      copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gdO),
                                gmem_thr.partition_D(sdO(_, _, stage)), tQcQ, rows);
    }
  };

  // Prologue: K, V and the first Q/dO tile in one commit group.
  copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gK), gmem_thr.partition_D(sK), tKVcKV,
                            kv_rows);
  copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gV), gmem_thr.partition_D(sV), tKVcKV,
                            kv_rows);
  BwdStep at = walk.at_step(mask, step_begin);  // the step computed next
  if (step_begin < step_end && !walk.done(at)) load_q_do(at, step_begin % kQStages);
  cp_async_fence();

  // dV += P^T dO and dK += dS^T Q: A transposed from P / dS, B transposed from dO / Q.
  typename Traits::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto copy_dkv_a = make_tiled_copy_A(LdsmTransposedCopy<Element>{}, mma_dkv);
  auto copy_dkv_b = make_tiled_copy_B(LdsmTransposedCopy<Element>{}, mma_dkv);
  // Register fragments shared by both GEMMs (same operand shapes).
  Tensor tdKVrA = thr_dkv.partition_fragment_A(sPt);              // (MMA, MMA_N, MMA_K)
  Tensor tdKVrB = thr_dkv.partition_fragment_B(sdOt(_, _, 0));    // (MMA, MMA_HD, MMA_K)
  Tensor tdVsPt = copy_dkv_a.get_thread_slice(tid).partition_S(sPt);
  Tensor tdKsdSt = copy_dkv_a.get_thread_slice(tid).partition_S(sdSt);
  Tensor tdVsdOt = copy_dkv_b.get_thread_slice(tid).partition_S(sdOt);  // (CPY, CPY_HD, CPY_K, S)
  Tensor tdKsQt = copy_dkv_b.get_thread_slice(tid).partition_S(sQt);
  Tensor acc_dk = partition_fragment_C(mma_dkv, TileKV{});       // (MMA, MMA_N, MMA_HD)
  Tensor acc_dv = partition_fragment_C(mma_dkv, TileKV{});
  clear(acc_dk);
  clear(acc_dv);

  // dQ = dS K: A from dS, B transposed from K.
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto copy_dq_a = make_tiled_copy_A(LdsmCopy<Element>{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(LdsmTransposedCopy<Element>{}, mma_dq);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, MMA_M, MMA_K)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);   // (MMA, MMA_HD, MMA_K)
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tid).partition_S(sdS);
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tid).partition_S(sKt);
  Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(TileQ{}));  // (MMA, MMA_M, MMA_HD)

  // Staged dQ: the rows a step staged are added once the next barrier has passed, thread r
  // adding row r. The first warps issue (and wait for) them all: spread over every warp, the
  // same adds ran 6-15% slower on an H100.
  const bool issues_bulk_add = tid < kBlockM;
  float* staged_dq = nullptr;  // the staged block's first row in the workspace
  int staged_rows = 0;
  auto add_staged_dq = [&] {
    if (tid < staged_rows) {
      bulk_add_f32(staged_dq + tid * kHeadDimPadded, dq_staging + tid * Traits::kDqRowStride,
                   kHeadDimPadded * int(sizeof(float)));
    }
  };

  // With two Q/dO buffers, the next step's tiles load while this step computes, into the
  // previous step's buffers: free once every warp has passed one of this step's barriers. Where
  // dQ leaves by per-thread atomics, they load after the mid-step barrier: issued at the loop
  // top, right behind the previous step's atomics, the loads waited for those, and the warps for
  // the loads at the next loop top (13% of stall samples at hd64 when it added by atomics, ncu);
  // after the barrier they ran 4% faster. Bulk adds leave through the copy engine: there the loads
  // stay at the top, with the whole step to land.
  auto load_next_q_do = [&](int step, BwdStep next) {
    if (kQStages == 2 && step + 1 < step_end && !walk.done(next)) {
      load_q_do(next, (step + 1) % kQStages);
      cp_async_fence();
    }
  };

  CUTE_NO_UNROLL
  for (int step = step_begin; step < step_end && !walk.done(at); ++step) {
    const int stage = kQStages == 1 ? 0 : step % kQStages;
    if (kQStages == 1 && step > step_begin) {
      __syncthreads();  // every warp is done with the previous step's Q and dO
      load_q_do(at, 0);
      cp_async_fence();
    }
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (Traits::kDqBulkReduce) {
      add_staged_dq();
      load_next_q_do(step, walk.next(mask, at));
    }

    const int head = at.head;
    const int m_block = at.m_block;
    const int64_t row_base = seq.row_stats_offset(p.heads, head);
    const ScoreMod score_mod(p, seq.batch, head, seq.mask_offset);
    const Dropout dropout(p, seq.batch, head);
    float* bias_grad = p.attn_bias_grad == nullptr ? nullptr
        : p.attn_bias_grad + (int64_t(seq.batch) * p.heads + head) * p.seqlen_q * p.seqlen_k;
    compute_p_ds<Traits>(p, seq, mask.for_head(head), score_mod, dropout, tid, sQ(_, _, stage),
                         sdO(_, _, stage), sK, sV, sP, sdS, m_block, n_block,
                         p.softmax_lse + row_base, p.softmax_d + row_base, bias_grad);
    if constexpr (Traits::kDqBulkReduce) {
      if (issues_bulk_add) wait_bulk_reads();  // the staging rows are free after the barrier
    }
    __syncthreads();  // P and dS are in shared memory
    if constexpr (!Traits::kDqBulkReduce) load_next_q_do(step, walk.next(mask, at));

    gemm_ss(mma_dkv, acc_dv, tdKVrA, tdKVrB, tdVsPt, tdVsdOt(_, _, _, stage), copy_dkv_a,
            copy_dkv_b);
    gemm_ss(mma_dkv, acc_dk, tdKVrA, tdKVrB, tdKsdSt, tdKsQt(_, _, _, stage), copy_dkv_a,
            copy_dkv_b);

    if (p.dq_accum != nullptr) {
      Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});  // (MMA, MMA_M, MMA_HD)
      clear(acc_dq);
      gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_dq_a, copy_dq_b);
      float* dq_accum = p.dq_accum + row_base * kHeadDimPadded;
      if constexpr (Traits::kDqBulkReduce) {
        stage_for_bulk_add<Traits::kDqRowStride>(dq_staging, acc_dq, tdQcdQ);
        staged_dq = dq_accum + int64_t(m_block) * kBlockM * kHeadDimPadded;
        staged_rows = min(kBlockM, seq.seqlen_q - m_block * kBlockM);
      } else if ((m_block + 1) * kBlockM <= seq.seqlen_q) {
        add_to_workspace<kHeadDim, kHeadDimPadded, true>(dq_accum, acc_dq, tdQcdQ,
                                                         m_block * kBlockM, seq.seqlen_q);
      } else {
        add_to_workspace<kHeadDim, kHeadDimPadded, false>(dq_accum, acc_dq, tdQcdQ,
                                                          m_block * kBlockM, seq.seqlen_q);
      }
    }
    at = walk.next(mask, at);
  }

  // Epilogue: dK (times the softmax scale, which S carried) and dV, staged where K and V were;
  // of a split block's pieces, only the last to finish writes them, summed.
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (Traits::kDqBulkReduce) add_staged_dq();
  if (piece.pieces == 1 || sum_pieces<Traits>(p, piece.block - (blocks - p.split_blocks),
                                              piece.pieces, mma_dkv, tid, acc_dk, acc_dv)) {
    Tensor gdK = local_tile(seq.template k_rows<Element, kHeadDim>(
                                p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, head_kv),
                            TileKV{}, make_coord(n_block, 0));
    Tensor gdV = local_tile(seq.template k_rows<Element, kHeadDim>(
                                p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, head_kv),
                            TileKV{}, make_coord(n_block, 0));
    store_tile<Traits>(mma_dkv, tid, acc_dk, p.softmax_scale, sK, gdK, kv_rows);
    store_tile<Traits>(mma_dkv, tid, acc_dv, 1.f, sV, gdV, kv_rows);
  }
  // The last adds read their staging rows while dK and dV leave; shared memory must outlive the
  // reads, not the adds, whose results the next kernel in the stream sees.
  if constexpr (Traits::kDqBulkReduce) {
    if (issues_bulk_add) wait_bulk_reads();
  }
#endif
}

template <class Traits, class Mask, class Seqs = DenseSeqs, class ScoreMod = IdentityScore,
          class Dropout = NoDropout>
__global__ void __launch_bounds__(Traits::kThreads) bwd_dq_kernel(const BwdParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimPadded = Traits::kHeadDimPadded;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDimPadded>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDimPadded>>;

  extern __shared__ char smem[];
  const int tid = threadIdx.x;

  // Rank r is query block num_m_blocks - 1 - r: under causal masking the last sees the most keys.
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const BlockWork work = block_work_sorted_tail(int(blockIdx.x), num_m_blocks,
                                                p.batch * p.heads, p.sorted_tail_blocks);
  const int m_block = num_m_blocks - 1 - work.rank;
  const int head = work.batch_head % p.heads;
  const int head_kv = head / (p.heads / p.heads_kv);
  const Seqs seq(p, work.batch_head / p.heads);
  const Mask mask = Mask(p, seq.batch, seq.seqlen_k, seq.mask_offset).for_head(head);
  const ScoreMod score_mod(p, seq.batch, head, seq.mask_offset);
  const Dropout dropout(p, seq.batch, head);
  const int rows = seq.seqlen_q - m_block * kBlockM;
  if (rows <= 0) return;  // past a shorter sequence of a variable-length batch
  const int n_block_max = mask.template key_block_end<kBlockN>(m_block * kBlockM + min(rows, kBlockM) - 1);
  const int n_block_min = mask.template key_block_begin<kBlockN>(m_block * kBlockM);

  // The same shared-memory carve-up as bwd_dkdv_kernel; Q and dO use stage 0.
  using SmemQ = typename Traits::SmemLayoutQ;
  using SmemK = typename Traits::SmemLayoutK;
  using SmemP = typename Traits::SmemLayoutP;
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), SmemQ{});
  Tensor sdO = make_tensor(sQ.data() + cosize(SmemQ{}), SmemQ{});
  Tensor sK = make_tensor(sdO.data() + cosize(SmemQ{}), SmemK{});
  Tensor sV = make_tensor(sK.data() + cosize(SmemK{}), SmemK{});
  Tensor sP = make_tensor(sV.data() + cosize(SmemK{}), SmemP{});
  Tensor sdS = make_tensor(sP.data() + cosize(SmemP{}), SmemP{});
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});

  typename Traits::Gmem::Load gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));
  Tensor gQ = local_tile(seq.template q_rows<const Element, kHeadDim>(
                             p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, head),
                         TileQ{}, make_coord(m_block, 0));
  Tensor gdO = local_tile(seq.template q_rows<const Element, kHeadDim>(
                              p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, head),
                          TileQ{}, make_coord(m_block, 0));
  Tensor mK = seq.template k_rows<const Element, kHeadDim>(p.k, p.k_batch_stride, p.k_row_stride,
                                                           p.k_head_stride, head_kv);
  Tensor mV = seq.template k_rows<const Element, kHeadDim>(p.v, p.v_batch_stride, p.v_row_stride,
                                                           p.v_head_stride, head_kv);
  copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gQ),
                            gmem_thr.partition_D(sQ(_, _, 0)), tQcQ, rows);
  copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(gdO),
                            gmem_thr.partition_D(sdO(_, _, 0)), tQcQ, rows);
  cp_async_fence();

  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto copy_dq_a = make_tiled_copy_A(LdsmCopy<Element>{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(LdsmTransposedCopy<Element>{}, mma_dq);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tid).partition_S(sdS);
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tid).partition_S(sKt);
  Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
  clear(acc_dq);

  const int64_t row_base = seq.row_stats_offset(p.heads, head);
  CUTE_NO_UNROLL
  for (int n_block = n_block_min; n_block < n_block_max; ++n_block) {
    if (!visits<kBlockM, kBlockN>(mask, m_block, n_block)) continue;  // adds nothing
    __syncthreads();  // every warp is done with the previous key block
    const int kv_rows = seq.seqlen_k - n_block * kBlockN;
    copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(local_tile(mK, TileKV{}, make_coord(n_block, 0))),
                              gmem_thr.partition_D(sK), tKVcKV, kv_rows);
    copy_tile<true, kHeadDim>(gmem_copy, gmem_thr.partition_S(local_tile(mV, TileKV{}, make_coord(n_block, 0))),
                              gmem_thr.partition_D(sV), tKVcKV, kv_rows);
    cp_async_fence();
    cp_async_wait<0>();
    __syncthreads();
    compute_p_ds<Traits>(p, seq, mask, score_mod, dropout, tid, sQ(_, _, 0), sdO(_, _, 0), sK,
                         sV, sP, sdS, m_block, n_block, p.softmax_lse + row_base,
                         p.softmax_d + row_base);
    __syncthreads();
    gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_dq_a, copy_dq_b);
  }

  cp_async_wait<0>();  // a block with no key block still has Q and dO in flight
  __syncthreads();
  Tensor gdQ = local_tile(seq.template q_rows<Element, kHeadDim>(p.dq, p.dq_batch_stride,
                                                                 p.dq_row_stride, p.dq_head_stride,
                                                                 head),
                          TileQ{}, make_coord(m_block, 0));
  Tensor sdQ = sQ(_, _, 0);
  store_tile<Traits>(mma_dq, tid, acc_dq, p.softmax_scale, sdQ, gdQ, rows);
#endif
}

}  // namespace flashgen
