// Dropout on the attention probabilities: P's element (i, j) is kept with probability 1 - p and
// then scaled by 1 / (1 - p), dropped (0) otherwise; the softmax's row sums see every element.
// A kernel takes a policy as a template parameter (NoDropout compiles to nothing) and constructs
// it per (sequence, head).
//
// The mask is a pure function of (seed, batch, head, i, j), so the backward regenerates what the
// forward drew whatever their tiles: one Philox-4x32-10 draw gives the four elements of an
// m16n8 accumulator atom a thread holds, (i0, j0), (i0, j0 + 1), (i0 + 8, j0), (i0 + 8, j0 + 1)
// with i0 % 16 < 8 and j0 even (mma.sync's and wgmma's fp32 accumulator layout alike), from the
// counter (j0 / 2, i0, batch, head) under the call's 64-bit seed. flashgen/reference.py's
// dropout_keep is the same function in torch.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>

#include "flashgen/common/params.h"
#include "flashgen/common/philox.h"

namespace flashgen {

struct NoDropout {
  static constexpr bool kEnabled = false;
  __device__ __forceinline__ NoDropout(AttentionParams const& /*p*/, int /*batch*/,
                                       int /*head*/) {}
};

struct Dropout {
  static constexpr bool kEnabled = true;
  uint32_t key0, key1;
  uint32_t batch, head;
  uint32_t threshold;  // an element is kept iff its 32 random bits are >= this
  float scale;         // 1 / (1 - p), on the kept elements

  __device__ __forceinline__ Dropout(AttentionParams const& p, int batch, int head)
      : batch(uint32_t(batch)), head(uint32_t(head)) {
    const uint64_t seed = uint64_t(__ldg(p.dropout_seed));
    key0 = uint32_t(seed);
    key1 = uint32_t(seed >> 32);
    threshold = uint32_t(fmin(double(p.dropout_p) * 4294967296.0, 4294967295.0));
    scale = 1.f / (1.f - p.dropout_p);
  }

  // The random bits of the atom whose first element is (row, col) of the sequence: x (row, col),
  // y (row, col + 1), z (row + 8, col), w (row + 8, col + 1).
  __device__ __forceinline__ PhiloxBits atom_bits(int row, int col) const {
    return philox4x32_10(PhiloxBits{uint32_t(col) >> 1, uint32_t(row), batch, head}, key0, key1);
  }
};

// fn(r, c, keep) for every element (r, c) of an fp32 accumulator of m16n8 atoms seen as (rows,
// cols) (mma/accumulator.cuh's rowcol view): its elements (2m + a, 2n + b) are atom (m, n)'s at
// (i0 + 8a, j0 + b). coords: the same view of the accumulator's (row, col) positions in the tile;
// row0, col0: the tile's first row and column in the sequence.
template <class Coords, class Fn>
__device__ __forceinline__ void for_each_dropout_decision(Dropout const& dropout,
                                                          Coords const& coords, int row0,
                                                          int col0, Fn&& fn) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(coords))::value;
  constexpr int kCols = decltype(size<1>(coords))::value;
  static_assert(kRows % 2 == 0 && kCols % 2 == 0);
  CUTE_UNROLL
  for (int m = 0; m < kRows / 2; ++m) {
    CUTE_UNROLL
    for (int n = 0; n < kCols / 2; ++n) {
      const auto first = coords(2 * m, 2 * n);
      const PhiloxBits bits = dropout.atom_bits(row0 + get<0>(first), col0 + get<1>(first));
      fn(2 * m, 2 * n, bits.x >= dropout.threshold);
      fn(2 * m, 2 * n + 1, bits.y >= dropout.threshold);
      fn(2 * m + 1, 2 * n, bits.z >= dropout.threshold);
      fn(2 * m + 1, 2 * n + 1, bits.w >= dropout.threshold);
    }
  }
}

}  // namespace flashgen
