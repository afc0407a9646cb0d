// Philox-4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3"), the
// counter-based generator of dropout.cuh. Host and device code alike: a CPU test compiles it with
// the host compiler and checks it against the published known answers and flashgen/reference.py.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHGEN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHGEN_HOST_DEVICE inline
#endif

namespace flashgen {

struct PhiloxBits {
  uint32_t x, y, z, w;
};

// Ten rounds of two 32 x 32 -> 64 bit multiplies, the key bumped by the Weyl constants between
// rounds.
FLASHGEN_HOST_DEVICE PhiloxBits philox4x32_10(PhiloxBits counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  PhiloxBits c = counter;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
#if defined(__CUDA_ARCH__)
    const uint32_t hi0 = __umulhi(kMul0, c.x), lo0 = kMul0 * c.x;
    const uint32_t hi1 = __umulhi(kMul1, c.z), lo1 = kMul1 * c.z;
#else
    const uint64_t p0 = uint64_t(kMul0) * c.x, p1 = uint64_t(kMul1) * c.z;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
#endif
    c = PhiloxBits{hi1 ^ c.y ^ key0, lo1, hi0 ^ c.w ^ key1, lo0};
  }
  return c;
}

}  // namespace flashgen
