// Host side of one backward specialisation: D, then dK/dV (and dQ by atomics into the fp32
// workspace, then converted), or on the deterministic path dK/dV then a dQ kernel. The dK/dV
// grid has a thread block per key block, plus splits - 1 more per split block.
#pragma once

#include <cuda_runtime.h>

#include "flashgen/mma/bwd_aux.cuh"
#include "flashgen/mma/bwd_kernel.cuh"
#include "flashgen/common/launch.cuh"
#include "flashgen/common/params.h"

namespace flashgen {

// Mask: a policy of common/mask.cuh; ScoreMod: of common/score_mod.cuh; Dropout: of
// common/dropout.cuh.
template <class Traits, class Mask, class ScoreMod, class Dropout>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen_q;
  // Empty inputs have trivial gradients; the caller fills them.
  if (rows == 0 || p.seqlen_k == 0) return cudaSuccess;
  const bool packed = p.cu_seqlens_q != nullptr;
  if (packed != (p.q_view_rows > 0)) return cudaErrorInvalidValue;
  // The per-row helpers' rows (mma/bwd_aux.cuh): (batch, heads, seqlen_q), or a packed batch's
  // (heads, its rows).
  const int64_t aux_heads = int64_t(aux_grid_batch(p)) * p.heads;
  const int64_t aux_rows = aux_heads * aux_grid_rows(p);
  const int64_t d_blocks =
      (aux_grid_rows(p) + kDRowsPerBlock<kHeadDim> - 1) / kDRowsPerBlock<kHeadDim> * aux_heads;
  const int64_t n_blocks = (int64_t(p.seqlen_k) + Traits::kBlockN - 1) / Traits::kBlockN *
                           p.batch * p.heads_kv;
  if (p.split_blocks < 0 || p.split_blocks > n_blocks || p.splits < 1) {
    return cudaErrorInvalidValue;
  }
  const bool split = p.split_blocks > 0 && p.splits > 1;
  const int64_t dkdv_blocks = n_blocks + (split ? int64_t(p.split_blocks) * (p.splits - 1) : 0);
  const int64_t m_blocks = (int64_t(p.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM *
                           p.batch * p.heads;
  const int64_t convert_blocks = (aux_rows * (kHeadDim / 8) + kAuxThreads - 1) / kAuxThreads;
  for (int64_t blocks : {d_blocks, dkdv_blocks, m_blocks, convert_blocks}) {
    if (cudaError_t err = check_grid(blocks); err != cudaSuccess) return err;
  }
  // D first: the GPU starts on it while the host sets up the rest.
  if (cudaError_t err = launch(softmax_d_kernel<Element, kHeadDim>, unsigned(d_blocks),
                               kAuxThreads, 0, stream, p);
      err != cudaSuccess) {
    return err;
  }
  auto dkdv = bwd_dkdv_kernel<Traits, Mask, DenseSeqs, ScoreMod, Dropout>;
  if (cudaError_t err = opt_in_shared_memory(dkdv, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  if (split) {  // the split blocks' dK and dV, then their counters (BwdParams.dkv_accum)
    const size_t bytes = size_t(p.split_blocks) * Traits::kSplitFloats * sizeof(float);
    if (cudaError_t err = cudaMemsetAsync(p.dkv_accum, 0, bytes, stream); err != cudaSuccess) {
      return err;
    }
  }
  if (p.dq_accum == nullptr) {  // deterministic: dK/dV, then dQ by its own kernel
    auto dq = bwd_dq_kernel<Traits, Mask, DenseSeqs, ScoreMod, Dropout>;
    if (cudaError_t err = opt_in_shared_memory(dq, Traits::kSmemBytes); err != cudaSuccess) {
      return err;
    }
    if (cudaError_t err = launch(dkdv, unsigned(dkdv_blocks), Traits::kThreads,
                                 Traits::kSmemBytes, stream, p);
        err != cudaSuccess) {
      return err;
    }
    return launch(dq, unsigned(m_blocks), Traits::kThreads, Traits::kSmemBytes, stream, p);
  }
  // dQ's workspace holds the per-row helpers' rows.
  const size_t bytes = size_t(aux_rows) * Traits::kHeadDimPadded * sizeof(float);
  if (cudaError_t err = cudaMemsetAsync(p.dq_accum, 0, bytes, stream); err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = launch(dkdv, unsigned(dkdv_blocks), Traits::kThreads,
                               Traits::kSmemBytes, stream, p);
      err != cudaSuccess) {
    return err;
  }
  return launch(dq_convert_kernel<Element, kHeadDim, Traits::kHeadDimPadded>,
                unsigned(convert_blocks), kAuxThreads, 0, stream, p);
}

}  // namespace flashgen
