// Generated from codegen/params.py, the one table of the kernels' run-time arguments: edit the
// table, then `python -m codegen.params` rewrites this file.
// Plain data: the Python binding fills it, the kernel reads it. No torch, pybind11 or CUDA types,
// so the binding compiles with a host compiler alone.
#pragma once

#include <cstdint>

namespace flashgen {

struct AttentionParams {
  // (batch, seqlen_q, heads, head_dim), any strides in elements (64-bit: batch * stride can pass
  // 2^31), head dim contiguous
  const void* q;
  int64_t q_batch_stride;
  int64_t q_row_stride;
  int64_t q_head_stride;
  // (batch, seqlen_k, heads_kv, head_dim)
  const void* k;
  int64_t k_batch_stride;
  int64_t k_row_stride;
  int64_t k_head_stride;
  // (batch, seqlen_k, heads_kv, head_dim)
  const void* v;
  int64_t v_batch_stride;
  int64_t v_row_stride;
  int64_t v_head_stride;
  int batch;
  int heads;
  int heads_kv;
  int seqlen_q;
  int seqlen_k;
  // applied to q.k
  float softmax_scale;
  // softmax_scale * log2(e): the softmax runs on exp2
  float scale_log2;
  // Causal mask: query row i sees key j iff j <= i + mask_offset. seqlen_k - seqlen_q aligns it to
  // the bottom-right corner (FlashAttention), 0 to the top-left (PyTorch SDPA)
  int mask_offset;
  // The window mask kind's band: query row i sees key j iff i + mask_offset - window_left <= j <= i
  // + mask_offset + window_right, each bound at most 1073741824 (unbounded). The causal kind reads
  // mask_offset alone
  int window_left;
  int window_right;
  // The softcap score modifier's cap c: scores become c * tanh(s * softmax_scale / c), and
  // scale_log2 is c * log2(e) (codegen/score_mods.py)
  float softcap;
  // The alibi score modifier's slopes: query row i and key j add -slope * |i + offset - j| to the
  // scaled score, offset the sequence's seqlen_k - seqlen_q; slope = alibi_slopes[batch *
  // alibi_batch_stride + head]
  const float* alibi_slopes;
  // 0: one slope per head for every sequence
  int64_t alibi_batch_stride;
  // The bias score modifier's (batch, heads, seqlen_q, seqlen_k) fp32 tensor added to the scaled
  // scores (SDPA's attn_mask; -inf hides a key), keys contiguous, any other strides (0 broadcasts)
  const float* attn_bias;
  int64_t attn_bias_batch_stride;
  int64_t attn_bias_head_stride;
  int64_t attn_bias_row_stride;
  // A config-defined mask's MaskRange and key-group bitmap (common/variant.cuh) per sequence and 16
  // query rows, (batch, ceil(seqlen_q / 16), mask_row_ints) ints
  int* mask_ranges;
  // A config-defined variant's tensors, contiguous, in the order its table declares them, each with
  // its sizes (1 past its rank)
  const void* variant_tensor0;
  int variant_size0_0;
  int variant_size0_1;
  int variant_size0_2;
  int variant_size0_3;
  const void* variant_tensor1;
  int variant_size1_0;
  int variant_size1_1;
  int variant_size1_2;
  int variant_size1_3;
  const void* variant_tensor2;
  int variant_size2_0;
  int variant_size2_1;
  int variant_size2_2;
  int variant_size2_3;
  const void* variant_tensor3;
  int variant_size3_0;
  int variant_size3_1;
  int variant_size3_2;
  int variant_size3_3;
  // The probability that dropout zeroes an attention probability (common/dropout.cuh); the kept
  // ones are scaled by 1 / (1 - dropout_p)
  float dropout_p;
  // (1,) int64 on the device: the dropout mask's Philox key, drawn from torch's CUDA generator per
  // forward call and reused by its backward
  const int64_t* dropout_seed;
  // (batch + 1,): a variable-length batch's sequence starts in packed (1, total rows, heads,
  // head_dim) tensors, then the total; seqlen_q and seqlen_k are then the longest lengths, each
  // sequence's causal mask aligns bottom-right and per-row statistics are (heads, total rows).
  // nullptr: equal lengths
  const int* cu_seqlens_q;
  // (batch + 1,): the keys' starts, with cu_seqlens_q; nullptr with cu_seqlens_q: the keys are a KV
  // cache (KV_CACHE_FIELDS)
  const int* cu_seqlens_k;
  // (batch,), with cu_seqlens_q: the keys each sequence attends to, the first seqused_k[b] of its
  // run in cu_seqlens_k (FlashAttention-3's); nullptr: the whole run
  const int* seqused_k;
  // (heads,) fp32: each query head's learnable sink logit, in the scaled scores' units, which joins
  // every row's softmax denominator with no value (gpt-oss's s_aux); the forward passes fold it
  // into o and softmax_lse. nullptr: none
  const float* sinks;
};

struct FwdParams : AttentionParams {
  // (batch, seqlen_q, heads, head_dim)
  void* o;
  int64_t o_batch_stride;
  int64_t o_row_stride;
  int64_t o_head_stride;
  // (batch, heads, seqlen_q), contiguous, natural log
  float* softmax_lse;
  // mma family: the grid's order (block_order.cuh, flashgen/schedule.py)
  int ranks_per_round;
  // hopper family: an int that the launcher zeroes and a persistent grid's blocks claim their next
  // tiles from, in order, as they free up (fwd_kernel.cuh). nullptr: tiles dealt out statically
  int* tile_counter;
  // hopper family: q and o's (batch, rows) extents as laid out, the bounds of their TMA
  // descriptors: (batch, seqlen_q), or (1, total rows) for a variable-length batch. 0: batch and
  // seqlen_q
  int q_view_batch;
  int q_view_rows;
  // hopper family: k and v's (batch, rows) extents as laid out: (batch, seqlen_k), (1, total rows)
  // packed, (cache rows, capacity) for a contiguous cache, (pages, page_size) for a paged one. 0:
  // batch and seqlen_k
  int kv_view_batch;
  int kv_view_rows;
  // The e4m3 forward (the hopper family's fwd_fp8 kind): q's, k's and v's dequantisation factors,
  // fp32 per (batch, KV head), element b * <name>_descale_batch_stride + h *
  // <name>_descale_head_stride (FlashAttention-3's q_descale, k_descale, v_descale); the scores are
  // scaled by q's and k's, the output by v's. v is then V^T with its keys permuted
  // (flashgen/fp8.py): (batch, heads_kv, head_dim, keys), v_row_stride the head dim's. nullptr: 1
  const float* q_descale;
  int64_t q_descale_batch_stride;
  int64_t q_descale_head_stride;
  const float* k_descale;
  int64_t k_descale_batch_stride;
  int64_t k_descale_head_stride;
  const float* v_descale;
  int64_t v_descale_batch_stride;
  int64_t v_descale_head_stride;
  // (batch,): the keys in each sequence's cache before this call's new ones; nullptr: seqlen_k, the
  // whole cache
  const int* cache_seqlens;
  // (batch,): the cache row of each sequence; nullptr: its own index
  const int* cache_batch_idx;
  // (batch,), a contiguous cache: each sequence's first key's position (FlashAttention-2's
  // cache_leftpad): attention covers positions cache_leftpad .. cache_seqlens + seqlen_new - 1, key
  // indices (masks, ALiBi) count from it, appended keys and rotary positions do not. nullptr: 0
  const int* cache_leftpad;
  // (batch, pages per sequence): a paged cache's page of each run of page_size keys; k and v are
  // then (pages, page_size, heads_kv, head_dim). nullptr: a contiguous cache
  const int* block_table;
  int64_t block_table_batch_stride;
  int page_size;
  // keys appended this call (k_new, by the decode kind's append): a sequence attends to
  // cache_seqlens + seqlen_new keys
  int seqlen_new;
};

struct BwdParams : AttentionParams {
  // (batch, seqlen_q, heads, head_dim): the forward's output
  const void* o;
  int64_t o_batch_stride;
  int64_t o_row_stride;
  int64_t o_head_stride;
  // (batch, seqlen_q, heads, head_dim)
  const void* dout;
  int64_t do_batch_stride;
  int64_t do_row_stride;
  int64_t do_head_stride;
  // (batch, seqlen_q, heads, head_dim)
  void* dq;
  int64_t dq_batch_stride;
  int64_t dq_row_stride;
  int64_t dq_head_stride;
  // (batch, seqlen_k, heads_kv, head_dim): summed over each KV head's group
  void* dk;
  int64_t dk_batch_stride;
  int64_t dk_row_stride;
  int64_t dk_head_stride;
  // (batch, seqlen_k, heads_kv, head_dim)
  void* dv;
  int64_t dv_batch_stride;
  int64_t dv_row_stride;
  int64_t dv_head_stride;
  // (batch, heads, seqlen_q), contiguous, natural log
  const float* softmax_lse;
  // (batch, heads, seqlen_q) workspace: rowsum(dout * out); hopper family: rows padded to whole
  // query blocks
  float* softmax_d;
  // (batch, heads, seqlen_q, head_dim padded to the kernel's row chunk) fp32 workspace that the key
  // blocks add their dq contributions to; nullptr selects the deterministic path (a second kernel
  // computes dq per query block). hopper family: per (batch, head, query block) in the kernel's
  // register order (hopper/bwd_aux.cuh), never nullptr
  float* dq_accum;
  // hopper family: (batch, heads, seqlen_q padded to whole query blocks) workspace: softmax_lse *
  // log2(e), +inf past the sequence and where a row saw no key
  float* softmax_lse_log2;
  // hopper family: per (batch, head, query block, consumer warpgroup) int workspace that the
  // launcher zeroes: the key blocks then add dQ in a fixed order (deterministic). nullptr: in any
  // order
  int* dq_semaphore;
  // hopper family, not deterministic: per (batch, head, query block) int workspace that the prepare
  // kernel zeroes: 0 while no key block has reached the query block, 1 while the first to reach it
  // stores its dQ shares to the workspace (which then needs no zeroing), 2 once they are stored and
  // the others may add. Kernels whose consumers add dQ from registers (BwdTraits::kDqFromRegisters)
  // ignore it
  int* dq_state;
  // mma family: (split_blocks, 2, block_n, head_dim padded) fp32 workspace, zeroed by the launcher,
  // where the pieces of each split key block add their dK and dV, then split_blocks int counters of
  // the pieces that have added (the last one writes dK and dV). Unused when split_blocks is 0
  float* dkv_accum;
  // the backward grid's order (block_work_sorted_tail, flashgen/schedule.py); the hopper family's
  // deterministic runs keep their own
  int sorted_tail_blocks;
  // hopper family, deterministic, without a mask: 1 where a (batch, KV head)'s key blocks fill at
  // most a quarter of the SMs (all run at once), so that each starts its walk its own share of the
  // way in, as without determinism, and a query block's dQ turns follow the order the key blocks
  // reach it; 0: the key blocks walk in order and the turns descend (each waits only on blocks
  // launched before it)
  int deterministic_rotation;
  // mma family: the dK/dV grid's last split_blocks key blocks run as `splits` pieces each, each a
  // share of the block's steps (grid_piece). Not on the deterministic path
  int split_blocks;
  int splits;
  // mma family, bias score modifier: (batch, heads, seqlen_q, seqlen_k) fp32, contiguous, of equal
  // lengths, where the dK/dV kernel writes dS, the gradient of the bias it added (nullptr: none
  // wanted)
  float* attn_bias_grad;
  // the rows of q, dout and dq as laid out: the total rows of a variable-length batch (packed,
  // batch 1), which bound the hopper family's TMA descriptors and size its packed workspaces and
  // the mma family's. 0: seqlen_q (equal lengths)
  int q_view_rows;
  // the rows of k, v, dk and dv as laid out, with q_view_rows. 0: seqlen_k
  int kv_view_rows;
};

struct DecodeParams : AttentionParams {
  // (batch, seqlen_q, heads, head_dim)
  void* o;
  int64_t o_batch_stride;
  int64_t o_row_stride;
  int64_t o_head_stride;
  // (batch, heads, seqlen_q), contiguous, natural log
  float* softmax_lse;
  // blocks that share each (sequence, KV head)'s keys, each an equal share of its key blocks; above
  // 1 they write o_accum and lse_accum and the last of them to finish combines them into o and
  // softmax_lse; 0: append only (the hopper forward attends, for chunked prefill)
  int num_splits;
  // (num_splits, batch, heads, seqlen_q, head_dim) fp32 workspace: each split's normalised output
  float* o_accum;
  // (num_splits, batch, heads, seqlen_q) fp32 workspace: each split's lse (-inf where it saw no
  // key)
  float* lse_accum;
  // with num_splits > 1: one counter per (query block, sequence and KV head) of the grid, 0 before
  // the launch and after it (the block that finds itself the last of its splits combines them and
  // resets its counter)
  int* split_counters;
  // split_counters' length; a launch that needs more fails
  int split_counter_count;
  // a variable-length batch: this launch attends for the sequences of min_seqlen_q to seqlen_q
  // queries and leaves the others' rows alone (a batch mixing prefill and decode runs as two
  // launches, each on its own tile and split); 0: every sequence
  int min_seqlen_q;
  // a variable-length batch: q's rows as packed (the total, and any spare rows after it), which
  // size the grids over its packed query blocks and rows in place of a dense batch of the longest
  // (packed_blocks.cuh's DecodeBlocks); 0 otherwise
  int q_view_rows;
  // (batch,): the keys in each sequence's cache before this call's new ones; nullptr: seqlen_k, the
  // whole cache
  const int* cache_seqlens;
  // (batch,): the cache row of each sequence; nullptr: its own index
  const int* cache_batch_idx;
  // (batch,), a contiguous cache: each sequence's first key's position (FlashAttention-2's
  // cache_leftpad): attention covers positions cache_leftpad .. cache_seqlens + seqlen_new - 1, key
  // indices (masks, ALiBi) count from it, appended keys and rotary positions do not. nullptr: 0
  const int* cache_leftpad;
  // (batch, pages per sequence): a paged cache's page of each run of page_size keys; k and v are
  // then (pages, page_size, heads_kv, head_dim). nullptr: a contiguous cache
  const int* block_table;
  int64_t block_table_batch_stride;
  int page_size;
  // keys appended this call (k_new, by the decode kind's append): a sequence attends to
  // cache_seqlens + seqlen_new keys
  int seqlen_new;
  // (batch, seqlen_new, heads_kv, head_dim): keys to append at cache_seqlens (rotated when
  // rotary_dim > 0) before attending; nullptr: none
  const void* k_new;
  int64_t k_new_batch_stride;
  int64_t k_new_row_stride;
  int64_t k_new_head_stride;
  // (batch, seqlen_new, heads_kv, head_dim)
  const void* v_new;
  int64_t v_new_batch_stride;
  int64_t v_new_row_stride;
  int64_t v_new_head_stride;
  // (batch, seqlen_q, heads, head_dim): q rotated, written by the append kernel and read by
  // attention in place of q when rotary_dim > 0
  void* q_rot;
  int64_t q_rot_batch_stride;
  int64_t q_rot_row_stride;
  int64_t q_rot_head_stride;
  // (rotary rows, rotary_dim / 2), contiguous, q's dtype
  const void* rotary_cos;
  const void* rotary_sin;
  // columns rotated (even, at most head_dim); 0: no rotary embedding
  int rotary_dim;
  // 1: pairs (2i, 2i + 1) (GPT-J); 0: pairs (i, i + rotary_dim / 2) (GPT-NeoX)
  int rotary_interleaved;
};

}  // namespace flashgen

// Every member in order, the base's first, for the binding: X(name) once per member.
#define FLASHGEN_ATTENTIONPARAMS_MEMBERS(X) X(q) X(q_batch_stride) X(q_row_stride) \
  X(q_head_stride) X(k) X(k_batch_stride) X(k_row_stride) X(k_head_stride) X(v) X(v_batch_stride) \
  X(v_row_stride) X(v_head_stride) X(batch) X(heads) X(heads_kv) X(seqlen_q) X(seqlen_k) \
  X(softmax_scale) X(scale_log2) X(mask_offset) X(window_left) X(window_right) X(softcap) \
  X(alibi_slopes) X(alibi_batch_stride) X(attn_bias) X(attn_bias_batch_stride) \
  X(attn_bias_head_stride) X(attn_bias_row_stride) X(mask_ranges) X(variant_tensor0) \
  X(variant_size0_0) X(variant_size0_1) X(variant_size0_2) X(variant_size0_3) X(variant_tensor1) \
  X(variant_size1_0) X(variant_size1_1) X(variant_size1_2) X(variant_size1_3) X(variant_tensor2) \
  X(variant_size2_0) X(variant_size2_1) X(variant_size2_2) X(variant_size2_3) X(variant_tensor3) \
  X(variant_size3_0) X(variant_size3_1) X(variant_size3_2) X(variant_size3_3) X(dropout_p) \
  X(dropout_seed) X(cu_seqlens_q) X(cu_seqlens_k) X(seqused_k) X(sinks)
#define FLASHGEN_FWDPARAMS_MEMBERS(X) FLASHGEN_ATTENTIONPARAMS_MEMBERS(X) X(o) X(o_batch_stride) \
  X(o_row_stride) X(o_head_stride) X(softmax_lse) X(ranks_per_round) X(tile_counter) \
  X(q_view_batch) X(q_view_rows) X(kv_view_batch) X(kv_view_rows) X(q_descale) \
  X(q_descale_batch_stride) X(q_descale_head_stride) X(k_descale) X(k_descale_batch_stride) \
  X(k_descale_head_stride) X(v_descale) X(v_descale_batch_stride) X(v_descale_head_stride) \
  X(cache_seqlens) X(cache_batch_idx) X(cache_leftpad) X(block_table) X(block_table_batch_stride) \
  X(page_size) X(seqlen_new)
#define FLASHGEN_BWDPARAMS_MEMBERS(X) FLASHGEN_ATTENTIONPARAMS_MEMBERS(X) X(o) X(o_batch_stride) \
  X(o_row_stride) X(o_head_stride) X(dout) X(do_batch_stride) X(do_row_stride) X(do_head_stride) \
  X(dq) X(dq_batch_stride) X(dq_row_stride) X(dq_head_stride) X(dk) X(dk_batch_stride) \
  X(dk_row_stride) X(dk_head_stride) X(dv) X(dv_batch_stride) X(dv_row_stride) X(dv_head_stride) \
  X(softmax_lse) X(softmax_d) X(dq_accum) X(softmax_lse_log2) X(dq_semaphore) X(dq_state) \
  X(dkv_accum) X(sorted_tail_blocks) X(deterministic_rotation) X(split_blocks) X(splits) \
  X(attn_bias_grad) X(q_view_rows) X(kv_view_rows)
#define FLASHGEN_DECODEPARAMS_MEMBERS(X) FLASHGEN_ATTENTIONPARAMS_MEMBERS(X) X(o) \
  X(o_batch_stride) X(o_row_stride) X(o_head_stride) X(softmax_lse) X(num_splits) X(o_accum) \
  X(lse_accum) X(split_counters) X(split_counter_count) X(min_seqlen_q) X(q_view_rows) \
  X(cache_seqlens) X(cache_batch_idx) X(cache_leftpad) X(block_table) X(block_table_batch_stride) \
  X(page_size) X(seqlen_new) X(k_new) X(k_new_batch_stride) X(k_new_row_stride) \
  X(k_new_head_stride) X(v_new) X(v_new_batch_stride) X(v_new_row_stride) X(v_new_head_stride) \
  X(q_rot) X(q_rot_batch_stride) X(q_rot_row_stride) X(q_rot_head_stride) X(rotary_cos) \
  X(rotary_sin) X(rotary_dim) X(rotary_interleaved)
