// Views of an mma.m16n8k16 accumulator fragment: as (rows, cols) for row-wise work (softmax,
// masking), and as the A operand of the next mma (P V without leaving the registers).
#pragma once

#include <cute/tensor.hpp>

namespace flashgen {

using namespace cute;

// An mma.m16n8k16 accumulator ((2 cols, 2 rows), MMA_M, MMA_N) seen as (rows, cols):
// ((2, MMA_M), (2, MMA_N)).
template <class Layout>
__device__ __forceinline__ constexpr auto rowcol_layout(Layout const& acc) {
  static_assert(decltype(rank(acc))::value == 3);
  static_assert(decltype(size<0>(acc))::value == 4);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<2>(acc)));
}

// The same accumulator as the A operand of the next mma: two 8-column C tiles form one 16-deep
// k-slice, ((2, 2), 2), MMA_M, MMA_N / 2).
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_a_layout(Layout const& acc) {
  static_assert(decltype(size<2>(acc))::value % 2 == 0);
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

}  // namespace flashgen
