// Reductions over a quad (lanes 4r .. 4r+3): the threads that share an accumulator row, in both
// mma.sync's and wgmma's fragment layouts.
#pragma once

namespace flashgen {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 2);
  return x + __shfl_xor_sync(0xffffffff, x, 1);
}

}  // namespace flashgen
