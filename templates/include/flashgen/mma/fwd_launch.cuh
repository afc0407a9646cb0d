// Host side of one forward specialisation: grid, shared memory, launch. No device queries and
// no tile heuristics here: the spec (and so Traits) was chosen in Python.
#pragma once

#include <cuda_runtime.h>

#include "flashgen/mma/fwd_kernel.cuh"
#include "flashgen/common/launch.cuh"
#include "flashgen/common/params.h"

namespace flashgen {

// Mask: a policy of common/mask.cuh; ScoreMod: of common/score_mod.cuh; Dropout: of
// common/dropout.cuh.
template <class Traits, class Mask, class ScoreMod, class Dropout>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  int64_t blocks;
  if (cudaError_t err = forward_tiles<Traits::kBlockM>(p, blocks); err != cudaSuccess) return err;
  if (blocks == 0) return cudaSuccess;
  // This family's forward reads dense or packed k and v, not a KV cache.
  if (p.cache_seqlens != nullptr || p.cache_batch_idx != nullptr || p.block_table != nullptr) {
    return cudaErrorNotSupported;
  }

  auto kernel = fwd_kernel<Traits, Mask, DenseSeqs, ScoreMod, Dropout>;
  if (cudaError_t err = opt_in_shared_memory(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  return launch(kernel, unsigned(blocks), Traits::kThreads, Traits::kSmemBytes, stream, p);
}

}  // namespace flashgen
