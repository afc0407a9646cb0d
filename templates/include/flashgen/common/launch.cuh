// Host helpers shared by the forward and backward launchers.
#pragma once

#include <climits>
#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"

namespace flashgen {

// Above 48 KB of dynamic shared memory a kernel must opt in; cheap, and per device, so done on
// every launch.
template <class Kernel>
cudaError_t opt_in_shared_memory(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// A 1-D grid of `blocks`, or an error if it does not fit one.
inline cudaError_t check_grid(int64_t blocks) {
  return blocks > INT_MAX ? cudaErrorInvalidConfiguration : cudaSuccess;
}

// A forward's tiles of kBlockM query rows (a packed batch's count its rows) into `tiles`, or the
// error that makes the launch invalid; no tiles: nothing to launch.
template <int kBlockM>
cudaError_t forward_tiles(const FwdParams& p, int64_t& tiles) {
  tiles = 0;
  if (p.cu_seqlens_q != nullptr && p.q_view_rows <= 0) return cudaErrorInvalidValue;
  tiles = PackedQueryBlocks<kBlockM>::grid_tiles(p);
  return check_grid(tiles);
}

}  // namespace flashgen
