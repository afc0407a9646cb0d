// Compile-time shape of one Hopper forward specialisation: shared-memory layouts, the two
// warpgroup GEMMs, the TMA boxes and the register split between producer and consumers.
// codegen/families/hopper/resources.py mirrors the budgets asserted here.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashgen/hopper/fragments.cuh"
#include "flashgen/hopper/warpgroup.cuh"

namespace flashgen::hopper {

// The producer's choice of each next tile, handed to the consumers through two slots
// (fwd_kernel.cuh, TileHandoff).
struct TileSlots {
  alignas(8) uint64_t ready[2];  // the producer has written the slot's tile
  alignas(8) uint64_t taken[2];  // every consumer thread has read it
  int index[2];
};

// kBlockM query rows per thread block, 64 per consumer warpgroup; kBlockN keys per K/V stage.
// kPingpong: the consumer warpgroups take turns issuing their GEMMs (named barriers), so one's
// softmax runs under another's GEMMs. kOverlap: inside a warpgroup, the next tile's QK^T is
// issued before this tile's softmax. Element: q's, k's and v's; ElementOut: o's. An e4m3
// Element (kFp8) reads V^T, its keys permuted as P's registers hold them (fp8_keys_of_slots).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, class Element_,
          bool kPingpong_, bool kOverlap_, class ElementOut_ = Element_>
struct FwdTraits {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr bool kFp8 = cute::sizeof_bits_v<Element> == 8;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = kBlockM / 64;  // consumer warpgroups
  static constexpr bool kPingpong = kPingpong_ && kConsumers > 1;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0 produces

  static_assert(kBlockM % 64 == 0 && kConsumers >= 1 && kConsumers <= 3,
                "block_m: 64, 128 or 192 (one consumer warpgroup per 64 rows)");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head_dim: a multiple of 16, at most 256");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "block_n: a multiple of 16, at most 256");
  static_assert(kStages >= 2, "kv_stages: at least 2");
  static_assert(!kFp8 || (kHeadDim % 32 == 0 && kBlockN % 32 == 0),
                "fp8: head_dim and block_n multiples of 32 (an 8-bit wgmma's k)");
  static_assert(cute::sizeof_bits_v<ElementOut> == 16, "the output is fp16 or bf16");

  // setmaxnreg: the producer keeps what TMA issue needs, the consumers share the rest of the
  // 64K registers (multiples of 8, one block per SM).
  static constexpr int kProducerRegisters = kConsumers == 1 ? 56 : kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 1 ? 256 : kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                kThreads * launch_registers(kThreads));

  using Atom = decltype(smem_atom<Element, kHeadDim>());
  using AtomOut = decltype(smem_atom<ElementOut, kHeadDim>());
  using HD = cute::Int<kHeadDim>;
  using BN = cute::Int<kBlockN>;
  // One consumer's 64 query rows: the Q box, and the O box of the TMA store.
  using SlabLayout = decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::_64, HD>{}));
  using SlabLayoutO = decltype(cute::tile_to_shape(AtomOut{}, cute::Shape<cute::_64, HD>{}));
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::_64, HD, cute::Int<kConsumers>>{}));
  using SmemLayoutO = decltype(cute::tile_to_shape(
      AtomOut{}, cute::Shape<cute::_64, HD, cute::Int<kConsumers>>{}));
  // One K tile (the TMA box), and the ring of them; V's, as V's rows, where 16-bit.
  using TileLayoutKV = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD>{}));
  using SmemLayoutKV =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD, cute::Int<kStages>>{}));
  // V as PV's B operand, (head_dim, keys): 16-bit, V's own tiles seen head dim contiguous
  // (MN-major); fp8 (whose wgmma takes K-major operands only), V^T's tiles as loaded, the keys
  // contiguous.
  using AtomVt = decltype(smem_atom<Element, kBlockN>());
  using TileLayoutVt = decltype(cute::tile_to_shape(AtomVt{}, cute::Shape<HD, BN>{}));
  using SmemLayoutVt = std::conditional_t<
      kFp8, decltype(cute::tile_to_shape(AtomVt{}, cute::Shape<HD, BN, cute::Int<kStages>>{})),
      decltype(cute::composition(
          SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HD, BN, cute::Int<kStages>>{},
                                                    cute::Step<cute::_2, cute::_1, cute::_3>{})))>;

  // Per consumer warpgroup: S = Q K^T (64 x kBlockN, both from shared memory) and O += P V
  // (64 x kHeadDim, P from registers).
  using OpS = decltype(cute::GMMA::ss_op_selector<Element, Element, float,
                                                  cute::Shape<cute::_64, BN, HD>>());
  using OpO = decltype(cute::GMMA::rs_op_selector<
                       Element, Element, float, cute::Shape<cute::_64, HD, BN>,
                       cute::GMMA::Major::K, kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN>());
  using TiledMmaS = decltype(cute::make_tiled_mma(OpS{}));
  using TiledMmaO = decltype(cute::make_tiled_mma(OpO{}));
  static_assert(!kFp8 || fp8_p_from_own_scores<OpS, OpO>(),
                "fp8: P's A-operand registers are not the thread's own scores at "
                "fp8_keys_of_slots' keys");

  // One instruction spans the whole n of each GEMM (a narrower one rereads its A operand per
  // instruction); an n outside CuTe's base shapes needs CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  // defined before CuTe's headers (the generated source does, per resources.py).
  static_assert(cute::size<1>(typename TiledMmaS::Shape_MNK{}) == kBlockN,
                "QK^T would split into narrower wgmmas: define "
                "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");
  static_assert(cute::size<1>(typename TiledMmaO::Shape_MNK{}) == kHeadDim,
                "PV would split into narrower wgmmas: define "
                "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorageQ {
    // Q, and each consumer's O on its own rows once its last QK^T has run (without an own
    // output buffer).
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>> v;
    typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    alignas(8) uint64_t q_full;  // Q has landed
    alignas(8) uint64_t q_free;  // Q's buffer may take the next tile's Q
    TileSlots tile_slots;
  };
  struct SharedStorageQO : SharedStorageQ {
    alignas(1024) cute::array_aligned<ElementOut, cute::cosize_v<SmemLayoutO>> o;
  };
  // O staged in a buffer of its own where shared memory allows: then Q's buffer frees at each
  // consumer's last QK^T, and the next tile's Q loads while this tile's last PV and output run.
  static constexpr bool kOwnOutputBuffer = sizeof(SharedStorageQO) <= 232448;
  using SharedStorage = std::conditional_t<kOwnOutputBuffer, SharedStorageQO, SharedStorageQ>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "tile needs more than the 227 KB of shared memory");
  static_assert(!kFp8 || kOwnOutputBuffer, "fp8: no room for O's 16-bit buffer beside Q");

  static constexpr uint32_t kSlabBytes = 64 * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTileBytes = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace flashgen::hopper
