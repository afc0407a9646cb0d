// The tensors a config-defined variant reads (codegen/variants.py), as its snippets index them.
// Apart from common/variant.cuh so that `flashgen generate` can compile a variant's snippets
// alone, in seconds, to report their errors against the config's table.
#pragma once

#include <cstdint>

#include "flashgen/common/params.h"

namespace flashgen {

// A contiguous tensor of a variant, indexed like the config's snippets write it: t(i, j).
template <class T, int kRank>
struct VariantTensor {
  T* data;
  int sizes[4];

  __device__ __forceinline__ VariantTensor(const void* data, int s0, int s1, int s2, int s3)
      : data(static_cast<T*>(data)), sizes{s0, s1, s2, s3} {}
  __device__ __forceinline__ int size(int dim) const { return sizes[dim]; }
  template <class... Index>
  __device__ __forceinline__ T operator()(Index... index) const {
    static_assert(sizeof...(Index) == kRank, "index a variant tensor by all of its dims");
    const int indices[] = {int(index)...};
    int64_t offset = 0;
    for (int d = 0; d < kRank; ++d) offset = offset * sizes[d] + indices[d];
    return __ldg(data + offset);  // read-only: the non-coherent cache path
  }
};

}  // namespace flashgen
