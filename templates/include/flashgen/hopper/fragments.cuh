// Views of a warpgroup's wgmma accumulators, and the online softmax over them.
//
// A 64 x N fp32 accumulator holds, per thread, two rows (r and r + 8) of N / 4 columns, laid
// out ((2 columns, 2 rows, N / 8 column groups), MMA_M, MMA_N). The four threads of a quad share
// rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_fp8.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

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

// An 8-bit PV's k slot -> the key whose probability it holds. P's registers are the thread's own
// scores, no shuffle (pack_fp8_probabilities): a thread q of its quad holds keys 2q, 2q + 1,
// 2q + 8, 2q + 9 of each 16 in 16-bit accumulator order, and the A operand's slots 4q .. 4q + 3,
// so slot 4q + 2a + b of each 16 holds key 2q + b + 8a. V^T's keys follow the same order
// (flashgen/fp8.py), so the sum over slots is the sum over keys.
CUTE_HOST_DEVICE constexpr int fp8_key_of_slot(int slot) {
  const int quad_thread = slot % 16 / 4, a = slot % 4 / 2, b = slot % 2;
  return slot / 16 * 16 + 2 * quad_thread + b + 8 * a;
}

// pack_fp8_probabilities' source of A-operand value v (of a 32-key k-block): the scores'
// accumulator value (v % 2) + 2 * row + 4 * column group, v = v0 + 4 * row + 8 * half.
CUTE_HOST_DEVICE constexpr int fp8_score_of_value(int v) {
  const int v0 = v % 4, row = v / 4 % 2, half = v / 8;
  return (v0 & 1) + 2 * row + 4 * (2 * half + (v0 >> 1));
}

// Whether, for every thread and A-operand value of PV (OpO, 8-bit), the score that
// pack_fp8_probabilities puts there (an accumulator value of QK^T, OpS) is in the same row and at
// the key fp8_key_of_slot says: CuTe's (thread, value) -> (row, column) layouts, checked at
// compile time.
template <class OpS, class OpO>
constexpr bool fp8_p_from_own_scores() {
  using A = typename cute::MMA_Traits<OpO>::ALayout;  // -> row + 64 * k slot, 64 x 32
  using C = typename cute::MMA_Traits<OpS>::CLayout;  // -> row + 64 * key
  for (int t = 0; t < 128; ++t) {
    for (int v = 0; v < 16; ++v) {
      const int a = A{}(t, v), c = C{}(t, fp8_score_of_value(v));
      if (a % 64 != c % 64 || fp8_key_of_slot(a / 64) != c / 64) return false;
    }
  }
  return true;
}

__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return low | high << 16;
}

// probs: ((2, 2, N / 8), 1, 1) fp32 -> operand: ((4, 2, 2), 1, N / 32) e4m3, an 8-bit PV's A
// operand, four values a register in fp8_score_of_value's order.
template <class Operand, class Probs>
__device__ __forceinline__ void pack_fp8_probabilities(Operand& operand, Probs const& probs) {
  using namespace cute;
  static_assert(decltype(size<1>(probs))::value == 1 && decltype(size<2>(probs))::value == 1 &&
                decltype(size<1>(operand))::value == 1);
  static_assert(decltype(size(probs))::value == decltype(size(operand))::value);
  Tensor regs = recast<uint32_t>(operand);  // ((1, 2, 2), 1, N / 32)
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(operand); ++kb) {
    CUTE_UNROLL
    for (int r = 0; r < 4; ++r) {  // row + 2 * half
      const int u = 16 * kb + fp8_score_of_value(4 * r);
      regs(r + 4 * kb) = e4m3x4(probs(u), probs(u + 1), probs(u + 4), probs(u + 5));
    }
  }
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

// The probabilities (fp32, in the scores' registers) into P, PV's A operand: 16-bit P shares the
// scores' layout; 8-bit P is packed (pack_fp8_probabilities).
template <class P, class Probs>
__device__ __forceinline__ void probabilities_into(P& p, Probs const& probs) {
  if constexpr (cute::sizeof_bits_v<typename P::value_type> == 8) {
    pack_fp8_probabilities(p, probs);
  } else {
    convert_into(p, probs);
  }
}

}  // namespace flashgen::hopper
