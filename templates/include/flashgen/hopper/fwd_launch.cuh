// Host side of one Hopper forward specialisation: the TMA descriptors of q, k, v and o (built
// per call from the params' pointers and strides), grid, shared memory, launch. An fp8 forward's
// v is V^T (params.h's q_descale).
#pragma once

#include <algorithm>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "flashgen/common/launch.cuh"
#include "flashgen/common/params.h"
#include "flashgen/hopper/fwd_kernel.cuh"
#include "flashgen/hopper/tma.cuh"

namespace flashgen::hopper {

template <class Traits>
auto make_fwd_tmas(const FwdParams& p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  auto q = gmem_heads<Element, kHeadDim>(p.q, p.q_view_rows, p.heads, p.q_view_batch,
                                         p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  auto k = gmem_heads<Element, kHeadDim>(p.k, p.kv_view_rows, p.heads_kv, p.kv_view_batch,
                                         p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  auto o = gmem_heads<typename Traits::ElementOut, kHeadDim>(
      p.o, p.q_view_rows, p.heads, p.q_view_batch, p.o_row_stride, p.o_head_stride,
      p.o_batch_stride);
  auto tma_v = [&] {
    if constexpr (Traits::kFp8) {
      auto v = gmem_heads_keys_last<Element, kHeadDim>(p.v, vt_columns(p), p.heads_kv,
                                                       p.kv_view_batch, p.v_row_stride,
                                                       p.v_head_stride, p.v_batch_stride);
      return make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::TileLayoutVt{});
    } else {
      auto v = gmem_heads<Element, kHeadDim>(p.v, p.kv_view_rows, p.heads_kv, p.kv_view_batch,
                                             p.v_row_stride, p.v_head_stride, p.v_batch_stride);
      return make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::TileLayoutKV{});
    }
  }();
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, typename Traits::SlabLayout{});
  auto tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::TileLayoutKV{});
  auto tma_o = make_tma_copy(SM90_TMA_STORE{}, o, typename Traits::SlabLayoutO{});
  return FwdTmas<decltype(tma_q), decltype(tma_k), decltype(tma_v), decltype(tma_o)>{
      tma_q, tma_k, tma_v, tma_o};
}

// The kernel on its grid: one block per tile, or (with an own output buffer) a persistent grid.
template <class Traits, class Mask, class ScoreMod, class Dropout, bool kDense, class Tmas>
cudaError_t launch_fwd_kernel(FwdParams params, const Tmas& tmas, int64_t blocks,
                              cudaStream_t stream) {
  auto kernel = fwd_kernel<Traits, Mask, ScoreMod, Dropout, kDense, Tmas>;
  if (cudaError_t err = opt_in_shared_memory(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  // With an own output buffer a block walks tiles, loading each next tile's Q under the last
  // one's output, on one block per SM: without a mask every tile costs the same, so they are
  // dealt out statically; under a mask that hides keys they differ, so blocks claim them in order
  // (longest first within a (batch, head), dense_tile) from the params' tile counter, zeroed
  // here; without a counter from the caller, one block per tile. Without an own output buffer a
  // walking block gains nothing over a fresh one: one block per tile, which the kernel assumes
  // there (a tile without keys stages its output over Q).
  int* const counter = params.tile_counter;
  params.tile_counter = nullptr;
  int64_t grid = blocks;
  if constexpr (Traits::kOwnOutputBuffer) {
    int device = 0, sms = 0;
    if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        err != cudaSuccess) {
      return err;
    }
    if (!Mask::kHidesKeys) {
      grid = std::min<int64_t>(blocks, sms);
    } else if (counter != nullptr && blocks > sms) {
      if (cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(int), stream);
          err != cudaSuccess) {
        return err;
      }
      params.tile_counter = counter;
      grid = sms;
    }
  }
  return launch(kernel, unsigned(grid), Traits::kThreads, Traits::kSmemBytes, stream, params,
                tmas);
}

// Mask: a policy of common/mask.cuh; ScoreMod: of common/score_mod.cuh; Dropout: of
// common/dropout.cuh.
template <class Traits, class Mask, class ScoreMod, class Dropout>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  int64_t blocks;
  if (cudaError_t err = forward_tiles<Traits::kBlockM>(p, blocks); err != cudaSuccess) return err;
  if (blocks == 0) return cudaSuccess;

  // A paged cache's block never spans two pages (TmaRows).
  if (p.block_table != nullptr && (p.page_size <= 0 || p.page_size % Traits::kBlockN != 0)) {
    return cudaErrorNotSupported;
  }
  FwdParams params = p;
  if (params.q_view_batch == 0) {
    params.q_view_batch = p.batch;
    params.q_view_rows = p.seqlen_q;
  }
  if (params.kv_view_batch == 0) {
    params.kv_view_batch = p.batch;
    params.kv_view_rows = p.seqlen_k;
  }
  const auto tmas = make_fwd_tmas<Traits>(params);
  const bool dense = p.cu_seqlens_q == nullptr && p.cache_seqlens == nullptr &&
                     p.cache_batch_idx == nullptr && p.block_table == nullptr;
  if (dense) {
    return launch_fwd_kernel<Traits, Mask, ScoreMod, Dropout, true>(params, tmas, blocks, stream);
  }
  if (Traits::kFp8 && (p.cache_seqlens != nullptr || p.cache_batch_idx != nullptr ||
                        p.block_table != nullptr)) {
    return cudaErrorNotSupported;  // V^T's key blocks lie in order, a cache's need not
  }
  return launch_fwd_kernel<Traits, Mask, ScoreMod, Dropout, false>(params, tmas, blocks, stream);
}

}  // namespace flashgen::hopper
