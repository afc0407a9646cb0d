// Appends a call's new keys and values to the KV cache, with the rotary embedding applied to the
// keys and (into q_rot) to the queries: the first kernel of a decode launch, in the launch's
// stream, so attention then reads the new keys from the cache like the old ones.
#pragma once

#include "flashgen/common/kv_cache.cuh"
#include "flashgen/common/params.h"

namespace flashgen {

// Pairs (c0, c1) of columns rotated together by cos/sin column j: (2j, 2j + 1) interleaved
// (GPT-J), (j, j + rotary_dim / 2) split in halves (GPT-NeoX); the pairs past the rotary columns
// are copied, (2j, 2j + 1) either way.
struct RotaryPairs {
  const void* cos;
  const void* sin;
  int pairs;  // rotary_dim / 2
  bool interleaved;

  __device__ __forceinline__ int2 columns(int j) const {
    return j < pairs && !interleaved ? make_int2(j, j + pairs) : make_int2(2 * j, 2 * j + 1);
  }

  // (x0, x1) rotated by position `pos`'s angle j in fp32, as FlashAttention's reference does.
  template <class Element>
  __device__ __forceinline__ void rotate(float& x0, float& x1, int pos, int j) const {
    if (j >= pairs) return;
    const int64_t at = int64_t(pos) * pairs + j;
    const float c = float(static_cast<const Element*>(cos)[at]);
    const float s = float(static_cast<const Element*>(sin)[at]);
    const float r0 = x0 * c - x1 * s;
    x1 = x0 * s + x1 * c;
    x0 = r0;
  }
};

// Grid (max(seqlen_new, seqlen_q), batch): one block per new token of a sequence. kQPerToken:
// query token i sits at position cache_seqlens + i (causal), else all at cache_seqlens.
template <class Element, int kHeadDim, bool kQPerToken>
__global__ void append_kv_kernel(const DecodeParams p) {
#ifndef FLASHGEN_LAUNCH_ONLY  // (common/launch.cuh)
  constexpr int kPairs = kHeadDim / 2;
  const int token = blockIdx.x;
  const int batch = blockIdx.y;
  const RotaryPairs rotary{p.rotary_cos, p.rotary_sin, p.rotary_dim / 2,
                           p.rotary_interleaved != 0};

  if (token < p.seqlen_new) {
    Element* k_cache = static_cast<Element*>(const_cast<void*>(p.k));
    Element* v_cache = static_cast<Element*>(const_cast<void*>(p.v));
    const Element* k_new = static_cast<const Element*>(p.k_new) + batch * p.k_new_batch_stride +
                           token * p.k_new_row_stride;
    const Element* v_new = static_cast<const Element*>(p.v_new) + batch * p.v_new_batch_stride +
                           token * p.v_new_row_stride;
    for (int i = threadIdx.x; i < p.heads_kv * kPairs; i += blockDim.x) {
      const int head = i / kPairs;
      const int j = i % kPairs;
      const KvCacheRows cache(p, batch, head);
      const int key = cache.cached + token;
      if (key >= p.seqlen_k) continue;  // past the capacity: the host refuses what it can see
      const KvCacheRows::Offsets at = cache.offsets(key);
      const int2 c = rotary.columns(j);
      const Element* k_src = k_new + head * p.k_new_head_stride;
      const Element* v_src = v_new + head * p.v_new_head_stride;
      float x0 = float(k_src[c.x]), x1 = float(k_src[c.y]);
      rotary.rotate<Element>(x0, x1, key, j);
      k_cache[at.k + c.x] = Element(x0);
      k_cache[at.k + c.y] = Element(x1);
      v_cache[at.v + c.x] = v_src[c.x];
      v_cache[at.v + c.y] = v_src[c.y];
    }
  }

  if (p.rotary_dim > 0 && token < p.seqlen_q) {
    const int pos = CachedKeys(p, batch).cached + (kQPerToken ? token : 0);
    const Element* q = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                       token * p.q_row_stride;
    Element* q_rot = static_cast<Element*>(p.q_rot) + batch * p.q_rot_batch_stride +
                     token * p.q_rot_row_stride;
    for (int i = threadIdx.x; i < p.heads * kPairs; i += blockDim.x) {
      const int head = i / kPairs;
      const int j = i % kPairs;
      const int2 c = rotary.columns(j);
      const Element* src = q + head * p.q_head_stride;
      float x0 = float(src[c.x]), x1 = float(src[c.y]);
      rotary.rotate<Element>(x0, x1, pos, j);
      Element* dst = q_rot + head * p.q_rot_head_stride;
      dst[c.x] = Element(x0);
      dst[c.y] = Element(x1);
    }
  }
#endif
}

}  // namespace flashgen
