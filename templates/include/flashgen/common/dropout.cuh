// Dropout on the attention probabilities: P's element (i, j) is kept with probability 1 - p and
// then scaled by 1 / (1 - p), dropped (0) otherwise; the softmax's row sums see every element.
// A kernel takes a policy as a template parameter (NoDropout compiles to nothing) and constructs
// it per (sequence, head).
//
// The mask is a pure function of (seed, batch, head, i, j), so a backward regenerates what a
// forward drew whatever their families and tiles. One Philox-4x32-10 draw, at counter (j with
// bits 0 and 3 cleared, i with bit 3 cleared, batch, head) under the call's 64-bit seed, gives
// 16 random bits to each of the 8 elements rows {i0, i0 + 8} x columns {j0, j0 + 1, j0 + 8,
// j0 + 9} (i0 % 16 < 8, j0 % 16 < 8 and even): word x to row i0's columns j0 and j0 + 1 (low
// and high half), y to row i0 + 8's, z and w the same at columns j0 + 8 and j0 + 9. Those are
// two m16n8 fp32 accumulator atoms side by side, which a thread of mma.sync's tiles (column-
// paired in the backward, mma/tiling.cuh) and of wgmma's holds together; the hopper backward's
// transposed tiles split them over two lanes (for_each_dropout_decision_transposed).
// flashgen/reference.py's dropout_keep is the same function in torch.
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
  uint32_t threshold;  // an element is kept iff its 16 random bits are >= this
  float scale;         // 1 / (1 - p), on the kept elements

  __device__ __forceinline__ Dropout(AttentionParams const& p, int batch, int head)
      : batch(uint32_t(batch)), head(uint32_t(head)) {
    const uint64_t seed = uint64_t(__ldg(p.dropout_seed));
    key0 = uint32_t(seed);
    key1 = uint32_t(seed >> 32);
    threshold = uint32_t(fminf(rintf(p.dropout_p * 65536.f), 65535.f));
    scale = 1.f / (1.f - p.dropout_p);
  }

  // The random bits of the atom pair whose first element is (row, col) of the sequence.
  __device__ __forceinline__ PhiloxBits pair_bits(int row, int col) const {
    return philox4x32_10(PhiloxBits{uint32_t(col) & ~9u, uint32_t(row) & ~8u, batch, head},
                         key0, key1);
  }
  __device__ __forceinline__ bool keeps_low(uint32_t word) const {
    return (word & 0xFFFFu) >= threshold;
  }
  __device__ __forceinline__ bool keeps_high(uint32_t word) const {
    return (word >> 16) >= threshold;
  }
};

// fn(r, c, keep) for every element (r, c) of an fp32 accumulator of m16n8 atoms seen as (rows,
// cols) (mma/accumulator.cuh's and hopper/fragments.cuh's rowcol views): its elements (2m + a,
// 4n + 2h + b) are at (i0 + 8a, j0 + 8h + b) of atom pair (m, n), which the kernels' tiles keep
// 8 columns apart. coords: the same view of the accumulator's (row, col) positions in the tile;
// row0, col0: the tile's first row and column in the sequence.
template <class Coords, class Fn>
__device__ __forceinline__ void for_each_dropout_decision(Dropout const& dropout,
                                                          Coords const& coords, int row0,
                                                          int col0, Fn&& fn) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(coords))::value;
  constexpr int kCols = decltype(size<1>(coords))::value;
  static_assert(kRows % 2 == 0 && kCols % 4 == 0);
  CUTE_UNROLL
  for (int m = 0; m < kRows / 2; ++m) {
    CUTE_UNROLL
    for (int n = 0; n < kCols / 4; ++n) {
      const int r = 2 * m, c = 4 * n;
      const auto first = coords(r, c);
      const PhiloxBits bits = dropout.pair_bits(row0 + get<0>(first), col0 + get<1>(first));
      fn(r, c, dropout.keeps_low(bits.x));
      fn(r, c + 1, dropout.keeps_high(bits.x));
      fn(r + 1, c, dropout.keeps_low(bits.y));
      fn(r + 1, c + 1, dropout.keeps_high(bits.y));
      fn(r, c + 2, dropout.keeps_low(bits.z));
      fn(r, c + 3, dropout.keeps_high(bits.z));
      fn(r + 1, c + 2, dropout.keeps_low(bits.w));
      fn(r + 1, c + 3, dropout.keeps_high(bits.w));
    }
  }
}

// The same decisions for a transposed accumulator, keys as rows and query rows as columns (the
// hopper backward's S^T, a wgmma layout): a thread holds keys k and k + 8 (k % 16 < 8) of query
// rows q, q + 1, q + 8, q + 9 (q % 16 < 8, even), half of the two atom pairs at (q, k & ~1) and
// (q + 1, k & ~1); the lane 4 apart, with key k ^ 1, holds the other half. Each of the two draws
// one pair, keeps its own half of each word and passes the other half over by shuffle. coords:
// the accumulator's (key, row) positions seen as (rows, cols) (hopper/fragments.cuh's
// rows_by_cols): row r is key k + 8r, column c = 4t + 2h + e is query row q + 16t + 8h + e.
// Every lane of the warp must call it.
template <class Coords, class Fn>
__device__ __forceinline__ void for_each_dropout_decision_transposed(Dropout const& dropout,
                                                                     Coords const& coords,
                                                                     int key0, int row0,
                                                                     Fn&& fn) {
  using namespace cute;
  constexpr int kCols = decltype(size<1>(coords))::value;
  static_assert(decltype(size<0>(coords))::value == 2 && kCols % 4 == 0);
  const int key = key0 + get<0>(coords(0, 0));
  const uint32_t parity = uint32_t(key) & 1u;  // the half of each word this thread's keys take
  const uint32_t mine = 16u * parity, theirs = 16u - mine;
  CUTE_UNROLL
  for (int t = 0; t < kCols / 4; ++t) {
    const int query = row0 + get<1>(coords(0, 4 * t));
    const PhiloxBits own = dropout.pair_bits(query + int(parity), key);
    const uint32_t half = 0xFFFFu;
    const uint32_t sent_xy = ((own.x >> theirs) & half) | (((own.y >> theirs) & half) << 16);
    const uint32_t sent_zw = ((own.z >> theirs) & half) | (((own.w >> theirs) & half) << 16);
    const uint32_t got_xy = __shfl_xor_sync(0xffffffffu, sent_xy, 4);
    const uint32_t got_zw = __shfl_xor_sync(0xffffffffu, sent_zw, 4);
    CUTE_UNROLL
    for (int e = 0; e < 2; ++e) {  // query rows q + e and q + 8 + e: own pair iff e == parity
      const bool own_pair = uint32_t(e) == parity;
      const uint32_t x = own_pair ? (own.x >> mine) & half : got_xy & half;
      const uint32_t y = own_pair ? (own.y >> mine) & half : got_xy >> 16;
      const uint32_t z = own_pair ? (own.z >> mine) & half : got_zw & half;
      const uint32_t w = own_pair ? (own.w >> mine) & half : got_zw >> 16;
      fn(0, 4 * t + e, x >= dropout.threshold);
      fn(0, 4 * t + 2 + e, y >= dropout.threshold);
      fn(1, 4 * t + e, z >= dropout.threshold);
      fn(1, 4 * t + 2 + e, w >= dropout.threshold);
    }
  }
}

}  // namespace flashgen
