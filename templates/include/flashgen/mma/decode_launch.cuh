// Host side of one decode specialisation: append (when the call brings new keys), then split-KV
// attention whose last split to finish combines (unless num_splits is 0), its warps across the
// rows or, for a step of one warp's rows over a paged cache, across the keys. Every kernel in the
// caller's stream; no device reads, no allocation, so a CUDA graph replays it with new
// cache_seqlens and block tables.
#pragma once

#include <cuda_runtime.h>

#include "flashgen/common/kv_append.cuh"
#include "flashgen/common/launch.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/split_combine.cuh"
#include "flashgen/mma/decode_kernel.cuh"

namespace flashgen {

template <class Traits, class SpecMask, class SpecScoreMod>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  using Mask = typename DecodeMask<SpecMask>::type;
  using ScoreMod = typename DecodeScoreMod<SpecScoreMod>::type;
  using Element = typename Traits::Element;
  using Blocks = DecodeBlocks<Traits::kBlockM>;
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  // The attention's grid, checked before anything launches.
  dim3 grid;
  if (p.num_splits > 0) {
    if (p.cu_seqlens_q != nullptr && p.q_view_rows <= 0) return cudaErrorInvalidValue;
    if (cudaError_t err = check_grid(Blocks::grid_x(p)); err != cudaSuccess) return err;
    if (p.num_splits > 65535 || Blocks::grid_z(p) > 65535) return cudaErrorInvalidConfiguration;
    grid = dim3(unsigned(Blocks::grid_x(p)), unsigned(p.num_splits),
                unsigned(Blocks::grid_z(p)));
    if (p.num_splits > 1 && (p.split_counters == nullptr ||
                             int64_t(grid.x) * grid.z > p.split_counter_count)) {
      return cudaErrorInvalidValue;  // a counter per (x, z) of the grid: split_combine.cuh
    }
  }
  DecodeParams attention = p;
  if (p.k_new != nullptr && (p.seqlen_new > 0 || p.rotary_dim > 0)) {
    const dim3 append_grid(unsigned(max(p.seqlen_new, p.rotary_dim > 0 ? p.seqlen_q : 0)),
                           unsigned(p.batch));
    if (cudaError_t err = launch(append_kv_kernel<Element, Traits::kHeadDim, Mask::kHidesKeys>,
                                 append_grid, 128, 0, stream, p);
        err != cudaSuccess) {
      return err;
    }
    if (p.rotary_dim > 0) {
      attention.q = p.q_rot;
      attention.q_batch_stride = p.q_rot_batch_stride;
      attention.q_row_stride = p.q_rot_row_stride;
      attention.q_head_stride = p.q_rot_head_stride;
    }
  }
  if (p.num_splits == 0) return cudaSuccess;  // append only: the hopper forward attends

  // A step over a paged cache whose rows fit one warp's 16 (a block's packed rows are at most
  // seqlen_q x group) splits each key block over the warps, where a warp's share is at least two
  // 16-key steps: the paged rows' address work then stays off one computing warp (hd64's 128-key
  // blocks, pages of 16, batch 8, 8k: 42.6 us split, 46.7 across the rows). Contiguous caches
  // (level to 3.5% slower split) and shares of one step (hd128's 64-key blocks, paged: level to
  // 18% slower) keep the warps across the rows.
  constexpr bool kCanSplitKeys =
      Traits::kWarps > 1 && Traits::kBlockN % (32 * Traits::kWarps) == 0;
  const bool split_keys = kCanSplitKeys && p.block_table != nullptr &&
                          int64_t(p.seqlen_q) * (p.heads / max(p.heads_kv, 1)) <= 16;
  auto kernel = split_keys ? decode_kernel<Traits, Mask, ScoreMod, kCanSplitKeys>
                           : decode_kernel<Traits, Mask, ScoreMod, false>;
  if (cudaError_t err = opt_in_shared_memory(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  return launch(kernel, grid, Traits::kThreads, Traits::kSmemBytes, stream, attention);
}

}  // namespace flashgen
