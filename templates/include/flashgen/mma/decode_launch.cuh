// Host side of one decode specialisation: append (when the call brings new keys), split-KV
// attention (unless num_splits is 0), combine (when split). Every kernel in the caller's stream;
// no device reads, no allocation, so a CUDA graph replays it with new cache_seqlens and block
// tables.
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
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  DecodeParams attention = p;
  if (p.k_new != nullptr && (p.seqlen_new > 0 || p.rotary_dim > 0)) {
    const dim3 grid(unsigned(max(p.seqlen_new, p.rotary_dim > 0 ? p.seqlen_q : 0)),
                    unsigned(p.batch));
    append_kv_kernel<Element, Traits::kHeadDim, Mask::kHidesKeys><<<grid, 128, 0, stream>>>(p);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    if (p.rotary_dim > 0) {
      attention.q = p.q_rot;
      attention.q_batch_stride = p.q_rot_batch_stride;
      attention.q_row_stride = p.q_rot_row_stride;
      attention.q_head_stride = p.q_rot_head_stride;
    }
  }

  if (p.num_splits == 0) return cudaSuccess;  // append only: the hopper forward attends

  const int packed_rows = p.seqlen_q * (p.heads / p.heads_kv);
  const dim3 grid(unsigned((packed_rows + Traits::kBlockM - 1) / Traits::kBlockM),
                  unsigned(p.num_splits), unsigned(p.batch * p.heads_kv));
  if (grid.y > 65535 || grid.z > 65535) return cudaErrorInvalidConfiguration;
  auto kernel = decode_kernel<Traits, Mask, ScoreMod>;
  if (cudaError_t err = opt_in_shared_memory(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(attention);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.heads) * p.seqlen_q;  // per sequence, 4 a block
    if (cudaError_t err = check_grid((rows + 3) / 4); err != cudaSuccess) return err;
    if (p.batch > 65535) return cudaErrorInvalidConfiguration;
    combine_splits_kernel<Element, Traits::kHeadDim>
        <<<dim3(unsigned((rows + 3) / 4), unsigned(p.batch)), 128, 0, stream>>>(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace flashgen
