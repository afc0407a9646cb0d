// Compile-time shape of one Hopper forward specialisation: shared-memory layouts, the two
// warpgroup GEMMs, the TMA boxes and the register split between producer and consumers.
// codegen/families/hopper/resources.py mirrors the budgets asserted here.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

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
// issued before this tile's softmax.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, class Element_,
          bool kPingpong_, bool kOverlap_>
struct FwdTraits {
  using Element = Element_;
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

  // setmaxnreg: the producer keeps what TMA issue needs, the consumers share the rest of the
  // 64K registers (multiples of 8, one block per SM).
  static constexpr int kProducerRegisters = kConsumers == 1 ? 56 : kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 1 ? 256 : kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                kThreads * launch_registers(kThreads));

  using Atom = decltype(smem_atom<Element, kHeadDim>());
  using HD = cute::Int<kHeadDim>;
  using BN = cute::Int<kBlockN>;
  // One consumer's 64 query rows: the Q box, and later the O box of the TMA store.
  using SlabLayout = decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::_64, HD>{}));
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::_64, HD, cute::Int<kConsumers>>{}));
  // One K or V tile (the TMA box), and the ring of them.
  using TileLayoutKV = decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD>{}));
  using SmemLayoutKV =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<BN, HD, cute::Int<kStages>>{}));
  // V as PV's B operand: (head_dim, keys), head dim contiguous (MN-major), same bytes.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HD, BN, cute::Int<kStages>>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // Per consumer warpgroup: S = Q K^T (64 x kBlockN, both from shared memory) and O += P V
  // (64 x kHeadDim, P from registers).
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, BN, HD>>()));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HD, BN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

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
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> o;
  };
  // O staged in a buffer of its own where shared memory allows: then Q's buffer frees at each
  // consumer's last QK^T, and the next tile's Q loads while this tile's last PV and output run.
  static constexpr bool kOwnOutputBuffer = sizeof(SharedStorageQO) <= 232448;
  using SharedStorage = std::conditional_t<kOwnOutputBuffer, SharedStorageQO, SharedStorageQ>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "tile needs more than the 227 KB of shared memory");

  static constexpr uint32_t kSlabBytes = 64 * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTileBytes = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace flashgen::hopper
