// Score modifiers: a function of each score s = q.k (before the softmax scale) and its position,
// applied before masking, and its derivative for the backward's dS. Kernels of every family take
// one as a template parameter; softcap, ALiBi and config-defined modifiers are further types with
// these members. The identity costs nothing: its loops compile away.
#pragma once

#include <cute/tensor.hpp>

namespace flashgen {

struct IdentityScore {
  static constexpr bool kIdentity = true;
  // The modified score of key col for query row (positions within the sequence).
  __device__ __forceinline__ float apply(float score, int /*row*/, int /*col*/) const {
    return score;
  }
  // dL/ds from dL/d(modified score) and the modified score itself.
  __device__ __forceinline__ float grad(float dmodified, float /*modified*/, int /*row*/,
                                        int /*col*/) const {
    return dmodified;
  }
};

// Applies the modifier to a partition of a score tile; coords holds each element's (row, col)
// within the tile, whose first element is (row0, col0) of the sequence.
template <class ScoreMod, class Scores, class Coords>
__device__ __forceinline__ void apply_score_mod(ScoreMod const& score_mod, Scores& scores,
                                                Coords const& coords, int row0, int col0) {
  if constexpr (!ScoreMod::kIdentity) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      scores(i) = score_mod.apply(scores(i), row0 + cute::get<0>(coords(i)),
                                  col0 + cute::get<1>(coords(i)));
    }
  }
}

}  // namespace flashgen
