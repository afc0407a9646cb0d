// Score modifiers: a function of each score s = q.k (before the softmax scale) and its position,
// applied before masking, and its derivative for the backward's dS. Kernels of every family take
// one as a template parameter (codegen/score_mods.py names them) and construct it per (sequence,
// head) they work on; config-defined modifiers are further types with these members. The identity
// costs nothing: its loops compile away.
#pragma once

#include <cute/tensor.hpp>

#include "flashgen/common/params.h"

namespace flashgen {

struct IdentityScore {
  static constexpr bool kIdentity = true;
  static constexpr bool kUnitDerivative = true;  // derivative() is 1: the backward skips it
  // Whether it depends on the head it was constructed for (a decode tile's rows span the heads
  // of a KV head, so it constructs one per row then).
  static constexpr bool kReadsHead = false;
  // For the sequence `batch` of the call, query head `head`; offset is the sequence's
  // seqlen_k - seqlen_q where the modifier is aligned bottom-right (the mask's offset).
  __device__ __forceinline__ IdentityScore(AttentionParams const& /*p*/, int /*batch*/,
                                           int /*head*/, int /*offset*/) {}
  // The modified score of key col for query row (positions within the sequence).
  __device__ __forceinline__ float apply(float score, int /*row*/, int /*col*/) const {
    return score;
  }
  // d(modified score)/ds from the modified score itself: the backward's dS is dP's softmax
  // gradient times this.
  __device__ __forceinline__ float derivative(float /*modified*/, int /*row*/,
                                              int /*col*/) const {
    return 1.f;
  }
};

// Gemma-2's and Grok's soft capping, softcap * tanh(s * softmax_scale / softcap), with the softcap
// factor moved into the softmax: the modified score is the tanh alone and the caller's scale_log2
// is softcap * log2(e) (codegen/score_mods.py), so the softmax sees softcap * tanh(...) for one
// multiply per score. The tanh's derivative is 1 - t^2 (in units of s * softmax_scale, the
// backward's dS); a masked score (-inf) has P = 0, and the clamp keeps its derivative finite.
struct Softcap {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = false;
  static constexpr bool kReadsHead = false;
  float prescale;  // softmax_scale / softcap

  __device__ __forceinline__ Softcap(AttentionParams const& p, int /*batch*/, int /*head*/,
                                     int /*offset*/)
      : prescale(p.softmax_scale / p.softcap) {}
  __device__ __forceinline__ float apply(float score, int /*row*/, int /*col*/) const {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(score * prescale));
    return t;
  }
  __device__ __forceinline__ float derivative(float modified, int /*row*/, int /*col*/) const {
    return 1.f - fminf(modified * modified, 1.f);
  }
};

// ALiBi (Press et al.; FlashAttention-2's alibi_slopes): s * softmax_scale - slope * |i + offset -
// j|, one slope per (sequence, head). The bias is divided by softmax_scale here so that the
// softmax's scale_log2 multiplies both terms.
struct Alibi {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = true;
  static constexpr bool kReadsHead = true;
  float slope;  // slope / softmax_scale
  int offset;

  __device__ __forceinline__ Alibi(AttentionParams const& p, int batch, int head, int offset)
      : slope(p.alibi_slopes[batch * p.alibi_batch_stride + head] / p.softmax_scale),
        offset(offset) {}
  __device__ __forceinline__ float bias(int row, int col) const {
    return slope * float(abs(row + offset - col));
  }
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    return score - bias(row, col);
  }
  __device__ __forceinline__ float derivative(float /*modified*/, int /*row*/, int /*col*/) const {
    return 1.f;
  }
};

// Softcap, then ALiBi, as FlashAttention-2 composes them: softcap * tanh(s * softmax_scale /
// softcap) - slope * |i + offset - j|. With Softcap's factor moved into the softmax (scale_log2 is
// softcap * log2(e)), ALiBi's bias is scaled by softmax_scale / softcap here. Only the tanh has a
// derivative; it is recovered from the modified score by adding the bias back.
struct SoftcapAlibi {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = false;
  static constexpr bool kReadsHead = true;
  Softcap cap;
  Alibi alibi;

  __device__ __forceinline__ SoftcapAlibi(AttentionParams const& p, int batch, int head,
                                          int offset)
      : cap(p, batch, head, offset), alibi(p, batch, head, offset) {
    alibi.slope *= cap.prescale;  // slope / softcap
  }
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    return alibi.apply(cap.apply(score, row, col), row, col);
  }
  __device__ __forceinline__ float derivative(float modified, int row, int col) const {
    return cap.derivative(modified + alibi.bias(row, col), row, col);
  }
};

// SDPA's attn_mask as an additive fp32 bias per (query row, key) of each (sequence, head), divided
// by softmax_scale here so that scale_log2 multiplies both terms; -inf hides the key. Rows and keys
// past the sequence (a tile's padding) read nothing.
struct ScoreBias {
  static constexpr bool kIdentity = false;
  static constexpr bool kUnitDerivative = true;
  static constexpr bool kReadsHead = true;
  const float* bias;  // this (sequence, head)'s first row
  int64_t row_stride;
  int seqlen_q;
  int seqlen_k;
  float inv_scale;

  __device__ __forceinline__ ScoreBias(AttentionParams const& p, int batch, int head,
                                       int /*offset*/)
      : bias(p.attn_bias + batch * p.attn_bias_batch_stride + head * p.attn_bias_head_stride),
        row_stride(p.attn_bias_row_stride), seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k),
        inv_scale(1.f / p.softmax_scale) {}
  __device__ __forceinline__ float apply(float score, int row, int col) const {
    if (row >= seqlen_q || col >= seqlen_k) return score;
    return fmaf(__ldg(bias + row * row_stride + col), inv_scale, score);
  }
  __device__ __forceinline__ float derivative(float /*modified*/, int /*row*/, int /*col*/) const {
    return 1.f;
  }
};

// The modifier a decode kernel runs for a spec's: the modifier itself, bar a config-defined one
// (common/variant.cuh: its positions count the cached keys before the new tokens).
template <class ScoreMod>
struct DecodeScoreMod {
  using type = ScoreMod;
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
