// Where one sequence's cached keys and values are: the one place kernels turn (sequence, key)
// into a KV-cache address. A contiguous cache is (cache rows, capacity, heads_kv, head_dim), a
// sequence's row chosen by cache_batch_idx; a paged one is (pages, page_size, heads_kv, head_dim),
// key j of a sequence in page block_table[sequence][j / page_size], any page size.
#pragma once

#include <cstdint>

#include "flashgen/common/params.h"

namespace flashgen {

// A sequence's keys in a cache: the position of the first (cache_leftpad), those cached before
// this call (where appended ones go) and the ones attention covers from the first, the appended
// ones included, never past the capacity (the host checks what it can see, this bounds what it
// cannot).
struct CachedKeys {
  int first, cached, seqlen_k;

  template <class Params>
  __device__ __forceinline__ CachedKeys(const Params& p, int batch)
      : first(p.cache_leftpad == nullptr ? 0 : max(0, p.cache_leftpad[batch])),
        cached(p.cache_seqlens == nullptr ? p.seqlen_k - p.seqlen_new : p.cache_seqlens[batch]),
        seqlen_k(max(0, min(cached + p.seqlen_new, p.seqlen_k) - first)) {}
};

struct KvCacheRows {
  struct Offsets {
    int64_t k, v;  // elements from p.k and p.v
  };

  int seqlen_k;      // the keys attention covers: the cached ones and the appended ones
  int first;         // the first one's position (cache_leftpad): key i is at first + i
  int cached;        // the keys cached before this call (where appended ones go)
  int64_t k_base, v_base;  // the KV head's (and contiguous: the cache row's) offset
  int64_t k_row_stride, v_row_stride;
  int64_t k_page_stride, v_page_stride;
  const int* pages;  // this sequence's block-table row; nullptr: contiguous
  int page_size;
  int page_shift;    // log2(page_size) when a power of two (a shift, not a division), else -1

  __device__ __forceinline__ KvCacheRows(const DecodeParams& p, int batch, int head_kv)
      : k_row_stride(p.k_row_stride), v_row_stride(p.v_row_stride),
        k_page_stride(p.k_batch_stride), v_page_stride(p.v_batch_stride),
        pages(p.block_table == nullptr ? nullptr
                                       : p.block_table + batch * p.block_table_batch_stride),
        page_size(p.page_size), page_shift(-1) {
    if (page_size > 0 && (page_size & (page_size - 1)) == 0) {
      for (page_shift = 0; (1 << page_shift) < page_size; ++page_shift) {
      }
    }
    const CachedKeys keys(p, batch);
    first = keys.first;
    cached = keys.cached;
    seqlen_k = keys.seqlen_k;
    const int64_t row = pages != nullptr ? 0
                        : p.cache_batch_idx == nullptr ? batch : p.cache_batch_idx[batch];
    k_base = row * p.k_batch_stride + head_kv * p.k_head_stride;
    v_base = row * p.v_batch_stride + head_kv * p.v_head_stride;
  }

  // The block-table entry of the page holding cache position `key` (0 for a contiguous cache): a
  // global read, which the decode kernel issues a loop step before the offsets that use it.
  __device__ __forceinline__ int page_of(int key) const {
    return pages == nullptr ? 0 : pages[page_index(key)];
  }

  // Where the key at cache position `key` is (attention's key i is at position first + i), its
  // page given by page_of.
  __device__ __forceinline__ Offsets offsets(int key, int page) const {
    if (pages == nullptr) return {k_base + key * k_row_stride, v_base + key * v_row_stride};
    const int in_page = key - page_index(key) * page_size;
    return {k_base + page * k_page_stride + in_page * k_row_stride,
            v_base + page * v_page_stride + in_page * v_row_stride};
  }

  __device__ __forceinline__ Offsets offsets(int key) const { return offsets(key, page_of(key)); }

 private:
  __device__ __forceinline__ int page_index(int key) const {
    return page_shift >= 0 ? key >> page_shift : key / page_size;
  }
};

}  // namespace flashgen
