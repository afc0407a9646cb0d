// Host side: the global tensors that the Hopper kernels' TMA descriptors are built over.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace flashgen::hopper {

// A (rows, head dim, heads, batch) tensor of one of the params' (batch, row, head) views.
template <class Element, int kHeadDim, class Pointer>
auto gmem_heads(Pointer ptr, int rows, int heads, int batch, int64_t row_stride,
                int64_t head_stride, int64_t batch_stride) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(static_cast<Element*>(const_cast<void*>(ptr))),
                     make_shape(rows, Int<kHeadDim>{}, heads, batch),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// V^T of an fp8 forward's (batch, heads, head dim, keys) view: a (head dim, keys, heads, batch)
// tensor, the keys contiguous, dim_stride between head-dim rows.
template <class Element, int kHeadDim, class Pointer>
auto gmem_heads_keys_last(Pointer ptr, int keys, int heads, int batch, int64_t dim_stride,
                          int64_t head_stride, int64_t batch_stride) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(static_cast<Element*>(const_cast<void*>(ptr))),
                     make_shape(Int<kHeadDim>{}, keys, heads, batch),
                     make_stride(dim_stride, _1{}, head_stride, batch_stride));
}

}  // namespace flashgen::hopper
