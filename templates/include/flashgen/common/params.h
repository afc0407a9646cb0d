// Run-time arguments of the forward and backward kernels. Plain data: the Python binding fills it, the kernel
// reads it. No torch, pybind11 or CUDA types, so the binding compiles with a host compiler alone.
#pragma once

#include <cstdint>

namespace flashgen {

struct FwdParams {
  const void* q;  // (batch, seqlen_q, heads, head_dim), any strides, head dim contiguous
  const void* k;  // (batch, seqlen_k, heads_kv, head_dim)
  const void* v;  // (batch, seqlen_k, heads_kv, head_dim)
  void* o;        // (batch, seqlen_q, heads, head_dim)
  float* softmax_lse;  // (batch, heads, seqlen_q), contiguous, natural log

  // Strides in elements. 64-bit: batch * stride can pass 2^31 on large inputs.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;

  int batch, heads, heads_kv, seqlen_q, seqlen_k;

  float softmax_scale;  // applied to q.k
  float scale_log2;     // softmax_scale * log2(e): the softmax runs on exp2
  // Causal only: query row i sees key j iff j <= i + causal_offset. seqlen_k - seqlen_q aligns the
  // mask to the bottom-right corner (FlashAttention), 0 to the top-left (PyTorch SDPA).
  int causal_offset;
  int ranks_per_round;  // the grid's order (block_order.cuh, flashgen/schedule.py)
};

// The backward pass: gradients of q, k, v from dout and the forward's out and softmax_lse.
struct BwdParams {
  const void* q;     // (batch, seqlen_q, heads, head_dim), any strides, head dim contiguous
  const void* k;     // (batch, seqlen_k, heads_kv, head_dim)
  const void* v;     // (batch, seqlen_k, heads_kv, head_dim)
  const void* o;     // (batch, seqlen_q, heads, head_dim): the forward's output
  const void* dout;  // (batch, seqlen_q, heads, head_dim)
  const float* softmax_lse;  // (batch, heads, seqlen_q), contiguous, natural log
  void* dq;          // (batch, seqlen_q, heads, head_dim)
  void* dk;          // (batch, seqlen_k, heads_kv, head_dim): summed over each KV head's group
  void* dv;          // (batch, seqlen_k, heads_kv, head_dim)
  float* softmax_d;  // (batch, heads, seqlen_q) workspace: rowsum(dout * out)
  // (batch, heads, seqlen_q, head_dim padded to the kernel's row chunk) fp32 workspace that the
  // key blocks add their dq contributions to with atomics; nullptr selects the deterministic
  // path (a second kernel computes dq per query block, no atomics).
  float* dq_accum;
  // (split_blocks, 2, block_n, head_dim padded) fp32 workspace, zeroed by the launcher, where the
  // pieces of each split key block add their dK and dV, then split_blocks int counters of the
  // pieces that have added (the last one writes dK and dV). Unused when split_blocks is 0.
  float* dkv_accum;

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  int batch, heads, heads_kv, seqlen_q, seqlen_k;
  float softmax_scale, scale_log2;
  int causal_offset;  // as in FwdParams
  int sorted_tail_blocks;  // the grids' order (block_work_sorted_tail, flashgen/schedule.py)
  // The dK/dV grid's last split_blocks key blocks run as `splits` pieces each, each piece a
  // share of the block's steps (grid_piece, flashgen/schedule.py). Not on the deterministic path.
  int split_blocks, splits;
};

}  // namespace flashgen
