// What the Hopper kernels share: shared-memory swizzles for wgmma operands, named barriers and
// one warpgroup's GEMM.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashgen::hopper {

// The widest GMMA swizzle whose atom (8 rows x 16..128 bytes) divides a row of `kCols`
// elements: 128-byte rows make bank-conflict-free loads for every wgmma operand.
template <class Element, int kCols>
constexpr auto smem_atom() {
  using namespace cute;
  constexpr int kRowBytes = kCols * int(sizeof_bits_v<Element>) / 8;
  if constexpr (kRowBytes % 128 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
  else if constexpr (kRowBytes % 64 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
  else if constexpr (kRowBytes % 32 == 0) return GMMA::Layout_K_SW32_Atom<Element>{};
  else return GMMA::Layout_K_INTER_Atom<Element>{};
}

// The registers per thread a block of `threads` threads launches with at one block per SM: what
// setmaxnreg redistributes. A warpgroup's setmaxnreg.inc waits until others' .dec have freed
// enough, so the split must fit in it, not in the register file (65536).
constexpr int launch_registers(int threads) { return 65536 / threads / 8 * 8; }

// Prefetches the TMA descriptors (kernel parameters) of the given copies, in order.
template <class... Tmas>
__device__ __forceinline__ void prefetch_tma_descriptors(Tmas const&... tmas) {
  (cute::prefetch_tma_descriptor(tmas.get_tma_descriptor()), ...);
}

// bar.sync / bar.arrive on named barrier `id` (0 is __syncthreads) among `threads` threads.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// named_sync that also returns whether `predicate` held in any of the threads.
__device__ __forceinline__ bool named_sync_or(int id, int threads, bool predicate) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred p, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(any)
      : "r"(uint32_t(predicate)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// A shared-memory operand's wgmma descriptors, advanced by 64-bit adds. CuTe's iterator adds to
// the low word and copies the high one, which ptxas emits as an add and a move of the constant
// high word per descriptor (UIADD3 + UMOV, two of each per wgmma); one 64-bit add (UIADD3.64)
// does both. The start address (the low 14 bits, in 16-byte units of at most 227 KB) never
// carries into the high word.
struct Descriptors64 {
  using reference = cute::GmmaDescriptor;
  using element_type = cute::GmmaDescriptor;
  using value_type = cute::GmmaDescriptor;
  uint64_t desc;

  CUTE_HOST_DEVICE constexpr reference operator*() const { return reference(desc); }
  template <class Index>
  CUTE_HOST_DEVICE constexpr reference operator[](Index const& i) const {
    return *(*this + i);
  }
  template <class Index>
  CUTE_HOST_DEVICE constexpr Descriptors64 operator+(Index const& offset) const {
    return {desc + uint64_t(offset)};
  }
};
// What mma_unpack's recast to the descriptors' register type finds (as for CuTe's iterator).
template <class NewT>
CUTE_HOST_DEVICE constexpr Descriptors64 recast_ptr(Descriptors64 const& descriptors) {
  static_assert(std::is_same_v<NewT, uint64_t>, "wgmma descriptors recast only to uint64_t");
  return descriptors;
}

template <class Operand>
constexpr bool kIsDescriptors =
    std::is_same_v<typename Operand::engine_type::iterator, cute::GMMA::DescriptorIterator>;

// A wgmma operand as issued: shared memory by 64-bit descriptors, registers as they are.
template <class Operand>
__device__ __forceinline__ decltype(auto) issued_operand(Operand const& operand) {
  if constexpr (kIsDescriptors<Operand>) {
    return cute::make_tensor(Descriptors64{operand.data().desc_.desc_}, operand.layout());
  } else {
    return (operand);
  }
}

// One warpgroup's GEMM: c (+)= a * b over every k-block, issued and committed, not waited for.
template <bool kZeroInit, class TiledMma, class A, class B, class C>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, A const& a, B const& b, C& c) {
  using namespace cute;
  warpgroup_fence_operand(c);
  if constexpr (!kIsDescriptors<A>) warpgroup_fence_operand(const_cast<A&>(a));
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  auto&& issued_a = issued_operand(a);
  auto&& issued_b = issued_operand(b);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, issued_a(_, _, k), issued_b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
}

}  // namespace flashgen::hopper
