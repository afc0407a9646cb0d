// Online softmax over the score tiles of one block of query rows (FlashAttention-2): a running
// row max and row sum, the output accumulator rescaled when the max grows, exp2 with the softmax
// scale folded into one FMA.
#pragma once

#include <cmath>
#include <cute/tensor.hpp>

#include "flashgen/common/quad.cuh"
#include "flashgen/common/sinks.cuh"
#include "flashgen/mma/accumulator.cuh"

namespace flashgen {

using namespace cute;

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // this thread's share; summed over the quad in finalize()

  __device__ __forceinline__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Turns the scores into unnormalised probabilities in place and rescales acc_o to the new max.
  //
  // A row's max only moves when the tile's max exceeds it by more than 2^kMaxGrowthLog2 in
  // probability: below that, the stale max keeps every probability under 2^kMaxGrowthLog2, where
  // fp16 and bf16 round P as finely as under 1, and the final lse accounts for whichever max was
  // used. After the first tiles the max rarely moves that far, and the warp skips the head_dim / 4
  // multiplies per row that rescaling acc_o costs (as many as the exponentials at head dim 128).
  static constexpr float kMaxGrowthLog2 = 8.f;

  template <class Scores, class AccO>
  __device__ __forceinline__ void update(Scores& scores, AccO& acc_o, float scale_log2) {
    Tensor s = make_tensor(scores.data(), rowcol_layout(scores.layout()));  // (rows, cols)
    Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));    // (rows, head_dim)
    static_assert(decltype(size<0>(s))::value == kRows);
    float correction[kRows];
    bool moved = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = s(r, 0);
      CUTE_UNROLL
      for (int c = 1; c < size<1>(s); ++c) tile_max = fmaxf(tile_max, s(r, c));
      tile_max = quad_max(tile_max);
      // -inf (no key seen yet) moves to any finite max; a tile of -inf moves nothing.
      const bool grows = tile_max * scale_log2 > row_max[r] * scale_log2 + kMaxGrowthLog2;
      correction[r] = grows ? exp2f((row_max[r] - tile_max) * scale_log2) : 1.f;
      row_max[r] = grows ? tile_max : row_max[r];
      row_sum[r] *= correction[r];
      moved |= grows;
    }
    if (__any_sync(0xffffffff, moved)) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(o); ++c) o(r, c) *= correction[r];
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // A row that has seen no key keeps max -inf; 0 as the base gives exp2(-inf) = 0 instead
      // of exp2(-inf - -inf) = NaN.
      const float base = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(s(r, c) * scale_log2 - base);
        row_sum[r] += s(r, c);
      }
    }
  }

  // Normalises acc_o and returns each row's log-sum-exp (natural log) in row_max, the scores'
  // scale the softmax ran with (scale_log2, update's) turned back into natural units, with row
  // r's sink sink_log2(r) (common/sinks.cuh; -inf: none) in the denominator. A row that saw no
  // key gets output 0 and lse -inf (or its sink).
  template <class AccO, class Sink>
  __device__ __forceinline__ void finalize(AccO& acc_o, float scale_log2, Sink&& sink_log2) {
    constexpr float kLn2 = 0.6931471805599453f;
    Tensor o = make_tensor(acc_o.data(), rowcol_layout(acc_o.layout()));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const SinkFold fold(row_max[r] * scale_log2, quad_sum(row_sum[r]), sink_log2(r));
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= fold.output_scale;
      row_max[r] = fold.lse_log2 * kLn2;
    }
  }
};

}  // namespace flashgen
