// The tensors a config-defined variant reads (codegen/variants.py), as its snippets index them.
// Apart from common/variant.cuh so that `flashgen generate` can compile a variant's snippets
// alone, in seconds, to report their errors against the config's table.
#pragma once

#include <cstdint>

#include "flashgen/common/params.h"

namespace flashgen {

// A contiguous tensor of a variant, indexed like the config's snippets write it: t(i, j). A read
// is clamped into the tensor, so a snippet may be evaluated whole, without branches, where a &&
// would have guarded a read; and it is a plain load (not __ldg's inline asm), so the compiler
// loads once what a thread's elements share (a row's value, a column's). Offsets are 32-bit
// (flashgen/variants.py refuses tensors of 2^31 elements or more): the arithmetic wraps, which
// moves a read outside the tensor to another element of it, never past it.
template <class T, int kRank>
struct VariantTensor {
  T* data;
  int sizes[4];
  uint32_t last;  // the last element's offset

  __device__ __forceinline__ VariantTensor(const void* data, int s0, int s1, int s2, int s3)
      : data(static_cast<T*>(data)), sizes{s0, s1, s2, s3} {
    uint32_t elements = 1;
    for (int d = 0; d < kRank; ++d) elements *= uint32_t(sizes[d]);
    last = elements - 1;
  }
  __device__ __forceinline__ int size(int dim) const { return sizes[dim]; }
  template <class... Index>
  __device__ __forceinline__ T operator()(Index... index) const {
    static_assert(sizeof...(Index) == kRank, "index a variant tensor by all of its dims");
    const int indices[] = {int(index)...};
    uint32_t offset = 0;
    for (int d = 0; d < kRank; ++d) offset = offset * uint32_t(sizes[d]) + uint32_t(indices[d]);
    return data[min(offset, last)];
  }
};

}  // namespace flashgen
