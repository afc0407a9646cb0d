// Host helpers shared by the forward and backward launchers.
//
// A kernel's source builds one of two ways (codegen/build.py). Whole: one translation unit holds
// the kernels and the launch code. Split, where cores are idle (a first call's build): the device
// code alone (`nvcc -cubin`), and beside it, in parallel, the launch code with
// FLASHGEN_LAUNCH_ONLY defined, which empties every kernel body; the cubin is linked into the
// launcher's library as flashgen_device_code, and a launch runs the kernel of the same name in it.
// Launchers call the kernels through launch() and opt_in_shared_memory() for either way.
#pragma once

#include <climits>
#include <cstdint>
#include <cuda_runtime.h>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashgen/common/packed_blocks.cuh"
#include "flashgen/common/params.h"

namespace flashgen {

#ifdef FLASHGEN_LAUNCH_ONLY
extern "C" __attribute__((visibility("hidden"))) const unsigned char flashgen_device_code[];

// The device code's kernel of `stub`'s name (its mangled name: both builds of one source
// instantiate the same templates), looked up once per kernel. Internal linkage: each kernel
// library keeps its own statics (an inline function's are one per process, STB_GNU_UNIQUE).
namespace {
cudaError_t device_kernel(const void* stub, const void*& kernel) {
  static cudaLibrary_t library = nullptr;
  static const cudaError_t loaded = cudaLibraryLoadData(&library, flashgen_device_code, nullptr,
                                                        nullptr, 0, nullptr, nullptr, 0);
  if (loaded != cudaSuccess) return loaded;
  static std::mutex mutex;
  static std::vector<std::pair<const void*, cudaKernel_t>> found;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [known, handle] : found) {
    if (known == stub) {
      kernel = handle;
      return cudaSuccess;
    }
  }
  const char* name = nullptr;
  if (cudaError_t err = cudaFuncGetName(&name, stub); err != cudaSuccess) return err;
  cudaKernel_t handle = nullptr;
  if (cudaError_t err = cudaLibraryGetKernel(&handle, library, name); err != cudaSuccess) {
    return err;
  }
  found.emplace_back(stub, handle);
  kernel = handle;  // the runtime takes a cudaKernel_t wherever it takes a kernel's address
  return cudaSuccess;
}
}  // namespace
#else
inline cudaError_t device_kernel(const void* stub, const void*& kernel) {
  kernel = stub;
  return cudaSuccess;
}
#endif

// Launches `kernel` with `args`, each converted to the kernel's parameter type.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, const Args&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  const void* function = nullptr;
  if (cudaError_t err = device_kernel(reinterpret_cast<const void*>(kernel), function);
      err != cudaSuccess) {
    return err;
  }
  std::tuple<std::remove_cv_t<Params>...> values{args...};
  return std::apply(
      [&](auto&... value) {
        void* pointers[] = {static_cast<void*>(&value)...};
        return cudaLaunchKernel(function, grid, block, pointers, smem_bytes, stream);
      },
      values);
}

// Above 48 KB of dynamic shared memory a kernel must opt in, once per device: the (kernel,
// device, bytes) that did are remembered, since a driver call per launch is host time a decode
// step pays on every layer.
template <class... Params>
cudaError_t opt_in_shared_memory(void (*kernel)(Params...), int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  const void* function = nullptr;
  if (cudaError_t err = device_kernel(reinterpret_cast<const void*>(kernel), function);
      err != cudaSuccess) {
    return err;
  }
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::vector<std::tuple<const void*, int, int>> opted;
  const std::tuple<const void*, int, int> key(function, device, bytes);
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& known : opted) {
    if (known == key) return cudaSuccess;
  }
  if (cudaError_t err =
          cudaFuncSetAttribute(function, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      err != cudaSuccess) {
    return err;
  }
  opted.push_back(key);
  return cudaSuccess;
}

// A 1-D grid of `blocks`, or an error if it does not fit one.
inline cudaError_t check_grid(int64_t blocks) {
  return blocks > INT_MAX ? cudaErrorInvalidConfiguration : cudaSuccess;
}

// A forward's tiles of kBlockM query rows (a packed batch's count its rows) into `tiles`, or the
// error that makes the launch invalid; no tiles: nothing to launch.
template <int kBlockM>
cudaError_t forward_tiles(const FwdParams& p, int64_t& tiles) {
  tiles = 0;
  if (p.cu_seqlens_q != nullptr && p.q_view_rows <= 0) return cudaErrorInvalidValue;
  tiles = PackedQueryBlocks<kBlockM>::grid_tiles(p);
  return check_grid(tiles);
}

}  // namespace flashgen
