// The step both backward kernels share: recompute one (block_m, block_n) tile of the attention
// probabilities from Q, K and the forward's log-sum-exp, and its score gradient, and leave
//   P  = exp(S * scale - lse)          S = Q K^T
//   dS = P * (dP - D)                  dP = dO V^T, D = rowsum(dO * O)
// in shared memory in the input type, for the GEMMs that consume them. Under dropout (keep mask
// Z, kept elements scaled by 1 / (1 - p)) the forward's output was O = (Z * P) V: P's place
// holds Z * P for dV, and dS = P * (Z * dP - D).
#pragma once

#include <cmath>
#include <cute/tensor.hpp>
#include <type_traits>

#include "flashgen/mma/accumulator.cuh"
#include "flashgen/mma/gemm.cuh"
#include "flashgen/common/dropout.cuh"
#include "flashgen/common/mask.cuh"
#include "flashgen/common/params.h"
#include "flashgen/common/score_mod.cuh"
#include "flashgen/mma/tiling.cuh"

namespace flashgen {

using namespace cute;

// sQ, sdO: (block_m, head_dim); sK, sV: (block_n, head_dim); sP, sdS: (block_m, block_n).
// lse and softmax_d point at this (sequence, head)'s rows; bias_grad, where not null, at its
// (seqlen_q, seqlen_k) slice of the bias score modifier's gradient, which gets dS. `masked` (a
// bool, or true_type / false_type for a copy of the step fixed at compile time): the tile
// straddles an edge of the mask.
template <class Traits, class Seqs, class Mask, class ScoreMod, class Dropout, class SmemQ,
          class SmemK, class SmemP, class Masked>
__device__ __forceinline__ void compute_p_ds_tile(const BwdParams& p, Seqs const& seq,
                                                  Mask const& mask, ScoreMod const& score_mod,
                                                  Dropout const& dropout, int tid, SmemQ const& sQ,
                                                  SmemQ const& sdO, SmemK const& sK,
                                                  SmemK const& sV, SmemP& sP, SmemP& sdS,
                                                  int m_block, int n_block, const float* lse,
                                                  const float* softmax_d, float* bias_grad,
                                                  Masked masked) {
  using Element = typename Traits::Element;
  using TileS = Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>;
  std::conditional_t<Dropout::kEnabled, typename Traits::TiledMmaSdPDropout,
                     typename Traits::TiledMmaSdP> mma;
  auto thr_mma = mma.get_thread_slice(tid);
  auto copy_a = make_tiled_copy_A(LdsmCopy<Element>{}, mma);
  auto copy_b = make_tiled_copy_B(LdsmCopy<Element>{}, mma);
  auto thr_a = copy_a.get_thread_slice(tid);
  auto thr_b = copy_b.get_thread_slice(tid);

  Tensor tScS = thr_mma.partition_C(make_identity_tensor(TileS{}));  // (row, col) in the tile
  Tensor coords = make_tensor(tScS.data(), rowcol_layout(tScS.layout()));  // (rows, cols)
  constexpr int kRows = decltype(size<0>(coords))::value;
  const int row0 = m_block * Traits::kBlockM;

  // This thread's rows of lse and D, loaded before the GEMMs so that their latency hides behind
  // them. Rows past seqlen_q (zero-filled Q and dO) and rows that saw no key (lse -inf) get
  // P = 0: exp2(x - inf) = 0 for every x, masked or not.
  float lse_log2[kRows], row_d[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + get<0>(coords(r, 0));
    const float row_lse = row < seq.seqlen_q ? lse[row] : -INFINITY;
    lse_log2[r] = row_lse == -INFINITY ? INFINITY : row_lse * 1.4426950408889634f;
    row_d[r] = row < seq.seqlen_q ? softmax_d[row] : 0.f;
  }

  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K)
  Tensor tdPrdO = thr_mma.partition_fragment_A(sdO);
  Tensor tdPrV = thr_mma.partition_fragment_B(sV);
  Tensor acc_s = partition_fragment_C(mma, TileS{});   // (MMA, MMA_M, MMA_N)
  Tensor acc_dp = partition_fragment_C(mma, TileS{});
  clear(acc_s);
  clear(acc_dp);
  gemm_ss(mma, acc_s, tSrQ, tSrK, thr_a.partition_S(sQ), thr_b.partition_S(sK), copy_a, copy_b);
  gemm_ss(mma, acc_dp, tdPrdO, tdPrV, thr_a.partition_S(sdO), thr_b.partition_S(sV), copy_a,
          copy_b);

  const int col0 = n_block * Traits::kBlockN;
  apply_score_mod(score_mod, acc_s, tScS, row0, col0);
  if (masked) apply_mask(mask, acc_s, tScS, row0, col0);

  Tensor s = make_tensor(acc_s.data(), rowcol_layout(acc_s.layout()));      // (rows, cols)
  Tensor dp = make_tensor(acc_dp.data(), rowcol_layout(acc_dp.layout()));
  auto p_and_ds = [&](int r, int c, bool keep) {
    const float score = s(r, c);
    const float prob = exp2f(score * p.scale_log2 - lse_log2[r]);
    float dprob = dp(r, c);
    if constexpr (Dropout::kEnabled) {
      dprob = keep ? dprob * dropout.scale : 0.f;
      s(r, c) = keep ? prob * dropout.scale : 0.f;
    } else {
      s(r, c) = prob;
    }
    dp(r, c) = prob * (dprob - row_d[r]);
    if constexpr (!ScoreMod::kUnitDerivative) {
      dp(r, c) *= score_mod.derivative(score, row0 + get<0>(coords(r, c)),
                                       col0 + get<1>(coords(r, c)));
    }
  };
  if constexpr (Dropout::kEnabled) {
    for_each_dropout_decision(dropout, coords, row0, col0, p_and_ds);
  } else {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) p_and_ds(r, c, true);
    }
  }

  if constexpr (std::is_same_v<ScoreMod, ScoreBias>) {
    if (bias_grad != nullptr) {  // dS is the gradient of the scaled score the bias adds to
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + get<0>(coords(r, 0));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dp); ++c) {
          const int col = col0 + get<1>(coords(r, c));
          if (row < seq.seqlen_q && col < seq.seqlen_k) {
            bias_grad[int64_t(row) * seq.seqlen_k + col] = dp(r, c);
          }
        }
      }
    }
  }

  auto store = make_tiled_copy_C(AccumulatorStoreCopy<Element>{}, mma);
  auto thr_store = store.get_thread_slice(tid);
  Tensor p_regs = make_tensor_like<Element>(acc_s);
  Tensor ds_regs = make_tensor_like<Element>(acc_dp);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) {
    p_regs(i) = Element(acc_s(i));
    ds_regs(i) = Element(acc_dp(i));
  }
  copy(store, thr_store.retile_S(p_regs), thr_store.partition_D(sP));
  copy(store, thr_store.retile_S(ds_regs), thr_store.partition_D(sdS));
}

// The step, in one copy per case where the traits ask for it (codegen/families/mma/
// resources.py): behind a plain `if`, ptxas predicates the mask into every step, two instructions per score element
// (11% of the hd64 dK/dV kernel's instructions, ncu).
template <class Traits, class Seqs, class Mask, class ScoreMod, class Dropout, class SmemQ,
          class SmemK, class SmemP>
__device__ __forceinline__ void compute_p_ds(const BwdParams& p, Seqs const& seq, Mask const& mask,
                                             ScoreMod const& score_mod, Dropout const& dropout,
                                             int tid, SmemQ const& sQ,
                                             SmemQ const& sdO, SmemK const& sK, SmemK const& sV,
                                             SmemP& sP, SmemP& sdS, int m_block, int n_block,
                                             const float* lse, const float* softmax_d,
                                             float* bias_grad = nullptr) {
  const bool masked =
      mask.template tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(m_block, n_block);
  if constexpr (!Traits::kMaskFreeStep) {
    compute_p_ds_tile<Traits>(p, seq, mask, score_mod, dropout, tid, sQ, sdO, sK, sV, sP, sdS,
                              m_block, n_block, lse, softmax_d, bias_grad, masked);
  } else if (masked) {
    compute_p_ds_tile<Traits>(p, seq, mask, score_mod, dropout, tid, sQ, sdO, sK, sV, sP, sdS,
                              m_block, n_block, lse, softmax_d, bias_grad, true_type{});
  } else {
    compute_p_ds_tile<Traits>(p, seq, mask, score_mod, dropout, tid, sQ, sdO, sK, sV, sP, sdS,
                              m_block, n_block, lse, softmax_d, bias_grad, false_type{});
  }
}

}  // namespace flashgen
