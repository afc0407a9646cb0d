// Views of a warpgroup's wgmma accumulators, and the online softmax over them.
//
// A 64 x N fp32 accumulator holds, per thread, two rows (r and r + 8) of N / 4 columns, laid
// out ((2 columns, 2 rows, N / 8 column groups), MMA_M, MMA_N). The four threads of a quad share
// rows.
#pragma once

#include <cmath>
#include <cute/tensor.hpp>

#include "flashgen/common/quad.cuh"
#include "flashgen/common/sinks.cuh"

namespace flashgen::hopper {

// ((2, 2, V), M, N) -> ((2, M), (2, V, N)): rows x columns of one thread's accumulator.
template <class Layout>
__device__ __forceinline__ constexpr auto rows_by_cols(Layout l) {
  using namespace cute;
  auto v = get<0>(l);
  return make_layout(make_layout(get<1>(v), get<1>(l)),
                     make_layout(get<0>(v), get<2>(v), get<2>(l)));
}

// ((2, 2, V), M, N) -> ((2, 2, 2), M, (V / 2, N)): the S accumulator read as the A operand of
// the PV wgmma (register-sourced, 16-bit): both give a thread the same rows and columns of each
// 16-column k-block in the same order, so P needs no shuffle.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_a_operand(Layout l) {
  using namespace cute;
  auto v = get<0>(l);
  auto halves = logical_divide(get<2>(v), Int<2>{});
  return make_layout(make_layout(get<0>(v), get<1>(v), get<0>(halves)), get<1>(l),
                     make_layout(get<1>(halves), get<2>(l)));
}

// Running max and sum of a thread's two rows, in exp2 units (scores times scale_log2). Each
// thread sums its own columns; the quad adds them up once, at the end.
struct OnlineSoftmax {
  float row_max[2];
  float row_sum[2];
  float scale_log2;

  __device__ __forceinline__ explicit OnlineSoftmax(float scale_log2) : scale_log2(scale_log2) {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Turns scores into unnormalised probabilities in place; rescale[r] is what the output rows
  // accumulated so far must be multiplied by.
  template <bool kFirst, class Scores>
  __device__ __forceinline__ void update(Scores& scores, float (&rescale)[2]) {
    using namespace cute;
    Tensor s = make_tensor(scores.data(), rows_by_cols(scores.layout()));
    static_assert(decltype(size<0>(s))::value == 2);
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_max(m);
      // A row that sees no key yet keeps -inf; subtracting 0 keeps its exponentials at 0.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      rescale[r] = kFirst ? 1.f : exp2f(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(fmaf(s(r, c), scale_log2, -m_scaled));
        sum += s(r, c);
      }
      row_sum[r] = kFirst ? sum : row_sum[r] * rescale[r] + sum;
    }
  }

  // Divides the output rows by their sums, the sink (exp2 units, common/sinks.cuh; -inf: none)
  // among them; returns each row's natural-log sum of exponentials (-inf, or the sink, with an
  // output of 0, for a row that saw no key).
  template <class Acc>
  __device__ __forceinline__ void finish(Acc& out, float (&lse)[2], float sink_log2) {
    using namespace cute;
    Tensor o = make_tensor(out.data(), rows_by_cols(out.layout()));
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const SinkFold fold(row_max[r] * scale_log2, sum != sum ? 0.f : sum, sink_log2);
      lse[r] = fold.lse_log2 * float(M_LN2);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= fold.output_scale;
    }
  }
};

template <class Acc>
__device__ __forceinline__ void scale_rows(Acc& acc, float const (&factor)[2]) {
  using namespace cute;
  Tensor t = make_tensor(acc.data(), rows_by_cols(acc.layout()));
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(t); ++c) t(r, c) *= factor[r];
  }
}

// dst = src converted to dst's element type; both fragments share one layout.
template <class Dst, class Src>
__device__ __forceinline__ void convert_into(Dst& dst, Src const& src) {
  using Element = typename Dst::value_type;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(src); ++i) dst(i) = static_cast<Element>(src(i));
}

}  // namespace flashgen::hopper
