// Attention sinks (params.h's sinks): a learnable logit per query head that joins every row's
// softmax denominator and adds no value, so a row may attend to "nothing". The forward passes
// fold it into the output and the lse at the end; the backward needs nothing more (its lse has
// it), and the sinks' own gradient comes from the rows' lse and D (flashgen/backward.py).
#pragma once

#include <cmath>

namespace flashgen {

// Query head `head`'s sink in exp2 units, those of the scores times scale_log2 (the logit is in
// the scaled scores' natural units); -inf without sinks.
template <class Params>
__device__ __forceinline__ float sink_log2(Params const& p, int head) {
  return p.sinks == nullptr ? -INFINITY : p.sinks[head] * float(M_LOG2E);
}

// A row's softmax with its sink: the row's max m and sum s in exp2 units (s = 0: no key seen)
// become the factor its output is multiplied by (1 / s without a sink) and its lse in log2 units.
struct SinkFold {
  float output_scale, lse_log2;

  __device__ __forceinline__ SinkFold(float m, float s, float sink) {
    if (s == 0.f) {  // no key: the sink alone, an output of 0
      output_scale = 0.f;
      lse_log2 = sink;
      return;
    }
    const float top = fmaxf(m, sink);
    const float kept = exp2f(m - top);  // 1 without a sink
    const float total = s * kept + exp2f(sink - top);
    output_scale = kept / total;
    lse_log2 = top + log2f(total);
  }
};

}  // namespace flashgen
