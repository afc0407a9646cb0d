// Host side of one forward specialisation: grid, shared memory, launch. No device queries and
// no tile heuristics here: the spec (and so Traits) was chosen in Python.
#pragma once

#include <climits>
#include <cuda_runtime.h>

#include "flashgen/fwd_kernel.cuh"
#include "flashgen/params.h"

namespace flashgen {

template <class Traits, bool kCausal>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  const int64_t num_m_blocks = (int64_t(p.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t blocks = num_m_blocks * p.batch * p.heads;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;

  auto kernel = fwd_kernel<Traits, kCausal>;
  constexpr int smem_bytes = Traits::kSmemBytes;
  if constexpr (smem_bytes > 48 * 1024) {
    // Above 48 KB a kernel must opt in; cheap, and per device, so done on every launch.
    cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<dim3(unsigned(blocks)), Traits::kThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashgen
