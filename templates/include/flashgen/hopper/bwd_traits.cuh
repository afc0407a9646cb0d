// Compile-time shape of one Hopper backward specialisation: shared-memory layouts, the five
// warpgroup GEMMs and the register split between producer and consumers.
// codegen/families/hopper/resources.py mirrors the budgets asserted here.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashgen/hopper/warpgroup.cuh"

namespace flashgen::hopper {

// A thread block owns kBlockN keys of one (batch, KV head) and walks the query blocks of kBlockM
// rows that see them (of every query head of the KV head's group), with Q and dO arriving through
// rings of kStages buffers. The consumers compute S^T = K Q^T and dP^T = V dO^T with keys as the
// GEMMs' M, dV += P^T dO and dK += dS^T Q, and dQ = dS K, split one of two ways:
// - by keys (head dims up to 128): 64 keys per consumer warpgroup, all kBlockM query rows and
//   the whole head dim of its keys' dK and dV, P^T and dS^T straight from registers as those
//   GEMMs' A operands; dQ's share is 64 query rows where kBlockM = 64 x consumers, else a share
//   of the head dim's columns, as dQ = dS K (kBlockM = 64) or, where kBlockM is no multiple of
//   wgmma's 64-row M, as dQ^T = K^T dS^T (the head dim's columns as M: kBlockM = 80 reads each K
//   and V byte for 80 query rows, not 64); column shares are whole swizzle atoms, the first
//   consumer's the larger where the atoms do not halve (head dim 96: 64 and 32 columns);
// - by the head dim (kSplitHeadDim, above 128, where one consumer's dK and dV would exceed its
//   registers): two consumers share the block's 64 keys, each computing S^T and dP^T for half the
//   query rows and owning half the head dim's columns of dK, dV and dQ; P^T joins dS^T in shared
//   memory, since each consumer's dV needs the other's columns of it.
// kDqBeforeDk issues dQ's GEMM ahead of dK's, so that dK's runs while the dQ share's adds issue;
// split by keys it holds P^T, dS^T and dQ's share live at once (8 bytes spilled at kBlockM = 128).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kDqBeforeDk_,
          class Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kDqBeforeDk = kDqBeforeDk_;
  static constexpr bool kSplitHeadDim = kHeadDim > 128;
  static constexpr int kConsumers = kSplitHeadDim ? 2 : kBlockN / 64;  // consumer warpgroups
  // Each consumer's S^T and dP^T (64 keys, its own or the block's, x kRows: all the query rows,
  // or its half) and dK and dV (64 keys x kKvCols: the whole head dim, or its half).
  static constexpr int kRows = kSplitHeadDim ? kBlockM / 2 : kBlockM;
  static constexpr int kKvCols = kSplitHeadDim ? kHeadDim / 2 : kHeadDim;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0 produces

  // The swizzle atom of the K, V, Q and dO tiles: the widest whose columns divide a consumer's
  // share of the head dim (split by it, 96 of head dim 192 take 32-column atoms), so that each
  // share is whole atoms.
  using Atom = decltype(smem_atom<Element, kKvCols>());
  static constexpr int kAtomCols = cute::size<1>(Atom{});

  // dQ's share per consumer c: kDqRows query rows x dq_cols(c) head-dim columns from column
  // dq_first_col(c), over the block's keys, computed transposed (columns x rows) where kBlockM
  // is no multiple of 64; the workspace holds the kDqShares shares of a query block one after
  // the other (dq_offset), each in the order of its accumulator registers.
  static constexpr bool kDqSplitRows = kBlockM == 64 * kConsumers;
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;
  static constexpr int kDqRows = kDqSplitRows ? 64 : kBlockM;
  static constexpr int kDqShares = kConsumers;
  static constexpr int kDqAtoms = kHeadDim / kAtomCols;
  static constexpr int dq_cols(int c) {
    if (kDqSplitRows || kConsumers == 1) return kHeadDim;
    const int first = (kDqAtoms + 1) / 2 * kAtomCols;
    return c == 0 ? first : kHeadDim - first;
  }
  static constexpr int dq_first_col(int c) { return kDqSplitRows || c == 0 ? 0 : dq_cols(0); }
  static constexpr int dq_floats(int c) { return kDqRows * dq_cols(c); }
  static constexpr int dq_offset(int c) { return c == 0 ? 0 : dq_floats(0); }
  static constexpr int kDqCols = dq_cols(0);  // the first (and widest) share's
  static constexpr bool kDqUneven = dq_cols(0) != dq_cols(kConsumers - 1);
  static constexpr int kDqBlockFloats = kBlockM * kHeadDim;  // every share of a query block
  static_assert(dq_offset(kConsumers - 1) + dq_floats(kConsumers - 1) == kDqBlockFloats);

  static_assert(kBlockN % 64 == 0 && kConsumers >= 1 && kConsumers <= 2,
                "block_n: 64 or 128 (one consumer warpgroup per 64 keys)");
  static_assert(!kSplitHeadDim || (kBlockN == 64 && kBlockM == 64 && kKvCols % 32 == 0),
                "above head dim 128 the two consumers share 64 keys (block_n 64) of 64 query rows "
                "(block_m 64) and split the head dim in halves of whole 32-column swizzle atoms "
                "(head_dim 192 or 256)");
  static_assert(kBlockM % 16 == 0 && kBlockM >= 64 && kBlockM <= 128,
                "block_m: a multiple of 16 from 64 to 128");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head_dim: a multiple of 16, at most 256");
  static_assert(kDqSplitRows || ((kBlockM == 64 || kDqTransposed) && dq_cols(1) > 0),
                "dQ splits over the consumers by 64 query rows (block_m = 64 x consumers) or, "
                "with block_m = 64 or no multiple of 64, by head-dim columns in whole swizzle "
                "atoms, at least one each");
  static_assert(!kDqTransposed || kDqCols == 64,
                "a transposed dQ share is one wgmma's 64 rows: head_dim = 64 x consumers");
  static_assert(kStages >= 1, "q_stages: at least 1");
  // With one Q stage, dO's tile is released first (after dV's and dQ's GEMMs, Q's after dK's):
  // the producer loads it first and the consumers run dP^T = V dO^T first, so that the next Q
  // has that GEMM to arrive under.
  static constexpr bool kDoFirst = kStages == 1;

  // Each consumer thread holds its S^T columns' query-row statistics (lse and D, kBlockM / 4 of
  // each) in registers ahead of use where that fits beside the accumulators (kBlockM 64 or 80);
  // kBlockM = 128 reads them from shared memory where used (D spills there, and lse alone in
  // registers ran slower).
  static constexpr bool kRowStatsInRegisters = kBlockM <= 80;

  // setmaxnreg: the producer keeps what TMA issue needs, the consumers share the rest
  // (multiples of 8).
  static constexpr int kProducerRegisters = kConsumers == 1 ? 56 : 24;
  static constexpr int kConsumerRegisters = kConsumers == 1 ? 256 : 240;
  static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                kThreads * launch_registers(kThreads));

  using HD = cute::Int<kHeadDim>;
  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using Stages = cute::Int<kStages>;
  // K and V (keys x head dim, one buffer; TileLayoutKV is the TMA box), and K's transpose as an
  // MN-major B operand.
  using TileLayoutKV = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD, cute::_1>{}));
  // Split by keys, a block loads V (K, where dO goes first) after the first step's first tile,
  // so that the first GEMM waits for one of them, and stores dK and dV by TMA. Split by the head
  // dim it loads both first and its threads store dK and dV: that way ran 1-11% faster at head
  // dim 256 (H100, cause unmeasured).
  static constexpr bool kSecondKeysLate = !kSplitHeadDim;
  static constexpr bool kStoreKvByTma = !kSplitHeadDim;
  // A consumer's share of dK or dV (64 keys x kKvCols) in K's or V's buffer: a TMA store's box.
  using TileLayoutKvShare =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::_64, cute::Int<kKvCols>>{}));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HD, BN, cute::_1>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));
  // Q and dO rings (query rows x head dim; TileLayoutQ is the TMA box), and their transposes
  // (dO's below, where its stages are known).
  using TileLayoutQ = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BM, HD>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BM, HD, Stages>{}));
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_ordered_layout(cute::Shape<HD, BM, Stages>{},
                                               cute::Step<cute::_2, cute::_1, cute::_3>{})));
  // dS (query rows x keys, two buffers; split by the head dim, two more for P) and its
  // transpose, which the consumers write from their dS^T (and P^T) accumulators by stmatrix,
  // transposing where keys are contiguous. As dQ's A operand query rows are contiguous
  // (MN-major); as dQ^T's B operand keys (K-major: 80 query rows take no MN-major swizzle wider
  // than 32 bytes, whose wgmma reads are slower).
  using DsAtom = std::conditional_t<kDqTransposed, decltype(smem_atom<Element, kBlockN>()),
                                    cute::GMMA::Layout_MN_SW128_Atom<Element>>;
  static constexpr int kDsBuffers = kSplitHeadDim ? 4 : 2;  // P's at 2 and 3
  using DsBuffers = cute::Int<kDsBuffers>;
  using SmemLayoutDs = decltype(cute::tile_to_shape(DsAtom{}, cute::Shape<BM, BN, DsBuffers>{}));
  using DsStoreAtom = std::conditional_t<kDqTransposed, cute::SM90_U16x8_STSM_T,
                                         cute::SM90_U32x4_STSM_N>;
  using SmemLayoutDst = decltype(cute::composition(
      SmemLayoutDs{}, cute::make_ordered_layout(cute::Shape<BN, BM, DsBuffers>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // Per consumer: S^T and dP^T (64 keys x kRows, both operands from shared memory); dV and dK
  // (64 keys x kKvCols; P^T and dS^T from registers, or split by the head dim from shared
  // memory); dQ (kDqRows x kDqCols over the block's keys; dQ^T, kDqCols x kDqRows, K^T's columns
  // times dS^T, where kDqTransposed).
  using Rows = cute::Int<kRows>;
  using KvCols = cute::Int<kKvCols>;
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, Rows, HD>>()));
  using DkvShape = cute::Shape<cute::_64, KvCols, BM>;
  using TiledMmaDkv = decltype(cute::make_tiled_mma(std::conditional_t<
      kSplitHeadDim,
      decltype(cute::GMMA::ss_op_selector<Element, Element, float, DkvShape, cute::GMMA::Major::K,
                                          cute::GMMA::Major::MN>()),
      decltype(cute::GMMA::rs_op_selector<Element, Element, float, DkvShape, cute::GMMA::Major::K,
                                          cute::GMMA::Major::MN>())>{}));
  template <int kCols>
  using DqShape = std::conditional_t<kDqTransposed, cute::Shape<cute::Int<kCols>, BM, BN>,
                                     cute::Shape<cute::_64, cute::Int<kCols>, BN>>;
  template <int kCols>
  using TiledMmaDqOf = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, DqShape<kCols>, cute::GMMA::Major::MN,
                                 kDqTransposed ? cute::GMMA::Major::K : cute::GMMA::Major::MN>()));
  // The first consumer's share, and the second's where they differ (kDqUneven).
  using TiledMmaDq = TiledMmaDqOf<dq_cols(0)>;
  using TiledMmaDqSecond = TiledMmaDqOf<dq_cols(kConsumers - 1)>;
  static_assert(cute::size<1>(typename TiledMmaDkv::Shape_MNK{}) == kKvCols,
                "dK and dV would split into narrower wgmmas: define "
                "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;

  // Split by the head dim, a 64-key block adds 64 rows x the whole head dim of dQ per step,
  // twice the bytes per FLOP of the 128-key blocks, and those adds limit the kernel: a run that
  // need not be deterministic adds each share from registers by 16-byte reductions (faster at
  // head dim 256 than the dQ warp's bulk adds). A deterministic one stages it for the dQ warp,
  // which adds the shares in turn, where a staging buffer fits beside dO's ring as deep as Q's
  // (the memory plan below); else its consumers add from registers in turn too (head dim 256,
  // where a second dO stage gained more than the staging buffer in its place).
  static constexpr bool kDqFromRegisters = kSplitHeadDim;

  // dO's ring has kDoStages stages; each consumer stages its dQ share for the dQ warp (unless it
  // adds from registers) in kDqBuffers buffers used in turn, each piece by piece (kDqPieces, a
  // buffer holding one piece).
  template <int kDoStages, int kDqBuffers, int kDqPieces>
  struct Storage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>> v;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, kDoStages * kBlockM * kHeadDim> dout;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutDs>> ds;
    alignas(128) float dq[cute::max(1, kDqBuffers * kDqBlockFloats / kDqPieces)];
    alignas(16) float lse_log2[kStages * kBlockM];  // each Q stage's rows' lse * log2(e)
    alignas(16) float d[kDoStages * kBlockM];       // each dO stage's rows' rowsum(dO * O)
    typename PipelineQ::SharedStorage pipeline_q;
    typename cutlass::PipelineTmaAsync<kDoStages>::SharedStorage pipeline_do;
    alignas(8) uint64_t k_full, v_full;
  };
  static constexpr int kSmemLimit = 232448;  // 227 KB
  template <int kDoStages, int kDqBuffers, int kDqPieces>
  static constexpr bool fits() {
    return sizeof(Storage<kDoStages, kDqBuffers, kDqPieces>) <= kSmemLimit;
  }
  // In order of preference, while shared memory has room: dO's ring as deep as Q's, and two
  // staging buffers, so that a step stages its share while the dQ warp still reads the last one;
  // one buffer (kBlockM = 80 at head dim 128); one dO stage (released after dV's and dQ's GEMMs,
  // it reloads under dK's); the share staged in two halves. Where the consumers add from
  // registers, dO's ring as deep as Q's first, then one staging buffer for deterministic runs if
  // it fits beside it, else none.
  static constexpr int kDqBuffers = kDqFromRegisters ? (fits<kStages, 1, 1>() ? 1 : 0)
                                    : fits<kStages, 2, 1>() ? 2 : 1;
  static constexpr int kDoStages = fits<kStages, kDqBuffers, 1>() ? kStages : 1;
  static constexpr int kDqPieces = fits<kDoStages, kDqBuffers, 1>() ? 1 : 2;
  // Consumer c's staging buffers (kDqBuffers of one piece each) start at dq_staging_offset(c).
  static constexpr int dq_piece_floats(int c) { return dq_floats(c) / kDqPieces; }
  static constexpr int dq_staging_offset(int c) { return kDqBuffers * dq_offset(c) / kDqPieces; }
  using SharedStorage = Storage<kDoStages, kDqBuffers, kDqPieces>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= kSmemLimit, "tile needs more than the 227 KB of shared memory");
  using DoStages = cute::Int<kDoStages>;
  using SmemLayoutDo = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BM, HD, DoStages>{}));
  using SmemLayoutDot = decltype(cute::composition(
      SmemLayoutDo{}, cute::make_ordered_layout(cute::Shape<HD, BM, DoStages>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using PipelineDo = cutlass::PipelineTmaAsync<kDoStages>;

  // A split key block's fp32 workspace (BwdParams.dkv_accum): its dK and dV, each consumer's in
  // the order of its accumulator registers, and, after every split block's, its counter.
  static constexpr int kSplitFloats = 2 * kBlockN * kHeadDim + 1;

  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);
  // A Q (or dO) stage: the tile and its rows' lse (or D).
  static constexpr uint32_t kStageBytes = kBlockM * kHeadDim * sizeof(Element) + kBlockM * 4;
};

}  // namespace flashgen::hopper
