// Host side of one Hopper backward specialisation: lse and D prepared and dQ's workspace zeroed,
// the main kernel on one thread block per (key block, KV head, batch), dQ converted.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "flashgen/common/launch.cuh"
#include "flashgen/common/params.h"
#include "flashgen/hopper/bwd_aux.cuh"
#include "flashgen/hopper/bwd_kernel.cuh"
#include "flashgen/hopper/tma.cuh"

namespace flashgen::hopper {

template <class Traits>
auto make_bwd_tmas(const BwdParams& p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  // (rows, head dim, heads, slots) as laid out: a packed batch is one slot (q_view_rows).
  const int q_rows = q_view_rows(p), kv_rows = kv_view_rows(p), slots = view_slots(p);
  auto q = gmem_heads<Element, kHeadDim>(p.q, q_rows, p.heads, slots, p.q_row_stride,
                                         p.q_head_stride, p.q_batch_stride);
  auto dout = gmem_heads<Element, kHeadDim>(p.dout, q_rows, p.heads, slots, p.do_row_stride,
                                            p.do_head_stride, p.do_batch_stride);
  auto k = gmem_heads<Element, kHeadDim>(p.k, kv_rows, p.heads_kv, slots, p.k_row_stride,
                                         p.k_head_stride, p.k_batch_stride);
  auto v = gmem_heads<Element, kHeadDim>(p.v, kv_rows, p.heads_kv, slots, p.v_row_stride,
                                         p.v_head_stride, p.v_batch_stride);
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, typename Traits::TileLayoutQ{});
  auto tma_do = make_tma_copy(SM90_TMA_LOAD{}, dout, typename Traits::TileLayoutQ{});
  auto tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::TileLayoutKV{});
  auto tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::TileLayoutKV{});
  auto dk = gmem_heads<Element, kHeadDim>(p.dk, kv_rows, p.heads_kv, slots, p.dk_row_stride,
                                          p.dk_head_stride, p.dk_batch_stride);
  auto dv = gmem_heads<Element, kHeadDim>(p.dv, kv_rows, p.heads_kv, slots, p.dv_row_stride,
                                          p.dv_head_stride, p.dv_batch_stride);
  auto store_share = [](auto const& gradient) {
    return make_tma_copy(SM90_TMA_STORE{}, gradient, typename Traits::TileLayoutKvShare{});
  };
  BwdTmas<decltype(tma_q), decltype(tma_k), decltype(store_share(dk))> tmas{
      tma_q, tma_do, tma_k, tma_v, {}, {}};
  if constexpr (Traits::kStoreKvByTma) {  // (else the kernel's threads store them)
    tmas.dk = store_share(dk);
    tmas.dv = store_share(dv);
  }
  return tmas;
}

// Mask: a policy of common/mask.cuh; ScoreMod: of common/score_mod.cuh; Dropout: of
// common/dropout.cuh. The main kernel's grid covers (batch, KV head) of the longest lengths,
// seqlen_q and seqlen_k: a variable-length batch (cu_seqlens_q, packed with q_view_rows and
// kv_view_rows set) as a dense batch of those, its blocks past a shorter sequence's rows exiting
// at once (every piece of a split one alike; a piece's steps are its share of its own
// sequence's walk). The workspaces hold only each sequence's own query blocks
// (QueryBlockLayout), and the helper kernels' grids run over those.
template <class Traits, class Mask, class ScoreMod, class Dropout>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  constexpr int kBlockM = Traits::kBlockM;
  const bool packed = p.cu_seqlens_q != nullptr;
  if (packed != (p.q_view_rows > 0) || packed != (p.kv_view_rows > 0)) {
    return cudaErrorInvalidValue;
  }
  // Empty inputs have trivial gradients; the caller fills them.
  if (int64_t(p.batch) * p.heads * p.seqlen_q == 0 || p.seqlen_k == 0) return cudaSuccess;
  const int64_t workspace_query_blocks = QueryBlockLayout<kBlockM>::total(p);
  const int64_t prepare_grid = workspace_query_blocks * kPrepareBlocks<Traits>;
  const int64_t key_blocks = (int64_t(p.seqlen_k) + Traits::kBlockN - 1) / Traits::kBlockN *
                             p.batch * p.heads_kv;
  if (p.split_blocks < 0 || p.split_blocks > key_blocks || p.splits < 1 ||
      (p.split_blocks > 0 && p.dq_semaphore != nullptr)) {
    return cudaErrorInvalidValue;
  }
  // The last split_blocks key blocks run as `splits` pieces each (grid_piece).
  const bool split = p.split_blocks > 0 && p.splits > 1;
  const int64_t grid_blocks = key_blocks + (split ? int64_t(p.split_blocks) * (p.splits - 1) : 0);
  const int64_t convert_blocks = workspace_query_blocks * DqConvert<Traits>::kBlocksPerQueryBlock;
  // (workspace_query_blocks: the kernels index query blocks in 32 bits.)
  for (int64_t blocks : {prepare_grid, grid_blocks, convert_blocks, workspace_query_blocks}) {
    if (cudaError_t err = check_grid(blocks); err != cudaSuccess) return err;
  }
  if (p.dq_semaphore != nullptr) {
    const size_t bytes = size_t(workspace_query_blocks) * Traits::kConsumers * sizeof(int);
    if (cudaError_t err = cudaMemsetAsync(p.dq_semaphore, 0, bytes, stream); err != cudaSuccess) {
      return err;
    }
  }
  if (split) {  // the split blocks' dK and dV, then their counters (BwdParams.dkv_accum)
    const size_t bytes = size_t(p.split_blocks) * Traits::kSplitFloats * sizeof(float);
    if (cudaError_t err = cudaMemsetAsync(p.dkv_accum, 0, bytes, stream); err != cudaSuccess) {
      return err;
    }
  }
  if (cudaError_t err = launch(bwd_prepare_kernel<Traits>, unsigned(prepare_grid), kAuxThreads,
                               0, stream, p);
      err != cudaSuccess) {
    return err;
  }
  const auto tmas = make_bwd_tmas<Traits>(p);
  auto kernel = bwd_kernel<Traits, Mask, ScoreMod, Dropout, decltype(tmas)>;
  if (cudaError_t err = opt_in_shared_memory(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = launch(kernel, unsigned(grid_blocks), Traits::kThreads,
                               Traits::kSmemBytes, stream, p, tmas);
      err != cudaSuccess) {
    return err;
  }
  return launch(bwd_dq_convert_kernel<Traits>, unsigned(convert_blocks), kAuxThreads, 0, stream,
                p);
}

}  // namespace flashgen::hopper
