"""Attention over a KV cache on validated tensors: one launch of a compiled decode kernel (append
and rotary, split-KV attention, combine), its split of the keys chosen here; or, for chunked
prefill where a family's forward reads the cache (the hopper family), the decode kernel's append
and then that forward."""

from __future__ import annotations

import functools
import math
import sys

import torch

from codegen import params
from codegen.arch import arch_for_capability
from codegen.families.mma import resources
from codegen.params import WINDOW_UNBOUNDED
from flashgen import dispatch, forward, host, loader, registry, variants
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers

# Calls with at least this many query rows per KV head (new tokens x query heads per KV head)
# run the head dim's first decode alt tile, a forward-sized one: chunked prefill computes.
PREFILL_ROWS = 256
MAX_SPLITS = 128
# Calls with at least this many new tokens run on a forward that reads the cache where one is
# configured (the hopper family on sm_90). That forward does not split the keys, so with fewer
# tiles (new tokens / block_m x heads x batch) than the GPU holds it loses to the decode kernel,
# which does: at batch 1 and 32 query heads, forward / decode read 1.26-1.87x at 128 new tokens
# and 0.79-1.03x at 256 (H100, head dims 64 and 128, GQA 1 and 4, 8k and 32k keys;
# docs/performance.md, section 4).
FORWARD_PREFILL_TOKENS = 256


@functools.lru_cache(maxsize=4096)  # a Python loop: decided once per shape, not per call
def choose_splits(work_blocks: int, key_blocks: int, slots: int) -> int:
    """How many blocks share each (query block, sequence, KV head)'s keys.

    work_blocks: blocks without a split; key_blocks: key blocks of the longest sequence the cache
    holds (its capacity: the lengths live on the device and are not read); slots: blocks the GPU
    runs at once. Grids that already fill most slots run unsplit. Otherwise the count, up to one
    wave's worth, whose waves fill the slots best (decode is bandwidth-bound: an SM running fewer
    blocks than the others reads less), the fewest among equals, each split at least one key
    block: a short cache gains most from many short splits (docs/performance.md, section 4)."""
    if work_blocks <= 0 or work_blocks >= 0.8 * slots:
        return 1
    # More than a wave's worth of splits buys no parallelism, only combine work.
    most = max(1, min(MAX_SPLITS, key_blocks, -(-slots // work_blocks)))

    def efficiency(splits: int) -> float:
        waves = work_blocks * splits / slots
        return waves / math.ceil(waves)

    return max(range(1, most + 1), key=lambda s: (round(efficiency(s), 3), -s))


def mixed_decode_tokens(batch: int, total: int, longest: int, group: int) -> int:
    """A variable-length batch of `total` query tokens whose longest sequence (`longest` tokens)
    takes the prefill tile: the most tokens of the sequences that run apart on the decode tile
    (fewer than PREFILL_ROWS packed rows), each launch with its own split; 0 where one launch
    serves (every sequence as long as the longest, a decode-sized longest, one sequence). On the
    prefill tile a decode row walks every key in a block of mostly empty rows."""
    if batch < 2 or longest * group < PREFILL_ROWS or total >= batch * longest:
        return 0
    return max(0, -(-PREFILL_ROWS // group) - 1)


def _splits(spec, tokens: int, sequences: int, longest: int, group: int, heads_kv: int,
            keys: int, slots: int) -> int:
    """The split count of one decode launch on spec's tile over at most `sequences` sequences of
    at most `longest` query tokens, `tokens` in all (their lengths live on the device), each
    seeing at most `keys` keys."""
    block_m = spec.tile.block_m
    work = min(sequences * -(-longest * group // block_m),
               -(-tokens * group // block_m) + sequences)  # at most one partial block a sequence
    return choose_splits(heads_kv * work, -(-keys // spec.tile.block_n), slots)


def decode(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
           cache_batch_idx, cache_leftpad, block_table, scale: float, window_left: int,
           window_right: int, softcap: float, alibi_slopes, sinks, rotary_interleaved: bool,
           num_splits: int, variant: str = "", variant_tensor0=None, variant_tensor1=None,
           variant_tensor2=None, variant_tensor3=None, cu_seqlens_q=None, max_seqlen_q: int = 0,
           *, out=None):
    """out (batch, seqlen_q, heads, dim) and lse (batch, heads, seqlen_q) fp32 for validated
    inputs (flashgen/kvcache.py), its arguments flashgen::fwd_kvcache's; k_new and v_new, when
    given, are written into the caches first (rotated when rotary_cos is given). The queries see
    the band of keys that validate.band describes, aligned bottom-right per sequence (causal:
    window_right 0); softcap > 0 caps the scores; alibi_slopes ((heads,) or (batch, heads) fp32) biases them, aligned
    bottom-right like the mask; sinks ((heads,) fp32) join each row's denominator;
    cache_leftpad ((batch,) int32) starts each sequence's keys there; variant: a config-defined
    variant's name (its mask in place of the band, which is then unbounded) with its checked
    tensors, on the decode kernel. With cu_seqlens_q ((batch + 1,) int32) q is a
    variable-length batch packed as (1, total, heads, dim), its longest sequence max_seqlen_q
    (flash_attn_varlen_func over a paged cache): out is then q's shape and lse (1, heads,
    total). out, when given, is the caller's buffer for the output (q's shape, aligned as
    host.is_aligned checks: the kernels store 16 bytes at a time)."""
    padded_head_dim = _padded_head_dim(q.get_device(), q.dtype, q.shape[-1])
    if padded_head_dim is not None:
        return _decode_padded(padded_head_dim, q, k_cache, v_cache, k_new, v_new, rotary_cos,
                              rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                              block_table, scale, window_left, window_right, softcap,
                              alibi_slopes, sinks, rotary_interleaved, num_splits, variant,
                              variant_tensor0, variant_tensor1, variant_tensor2, variant_tensor3,
                              cu_seqlens_q, max_seqlen_q, out=out)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not host.is_aligned(t):
            raise ValueError(f"flashgen: {name} must start at a 16-byte boundary with every "
                             f"stride a multiple of 8 elements (it is written in place, so it "
                             f"cannot be copied), got strides {t.stride()}")
    # Here, not in the traced wrapper: alignment reads data pointers, which fake tensors lack.
    if k_new is None:
        (q,) = host.aligned(q)
    else:
        q, k_new, v_new = host.aligned(q, k_new, v_new)
    batch, seqlen_q, heads, head_dim = q.shape
    packed = cu_seqlens_q is not None
    if packed:
        batch, seqlen_q = cu_seqlens_q.shape[0] - 1, max_seqlen_q
    heads_kv = k_cache.shape[2]
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    dtype = "fp16" if q.dtype == torch.float16 else "bf16"
    # The kernels align each sequence's band bottom-right to its own cache length. One query
    # sees every key up to its own: a right bound hides nothing then.
    band = Band(capacity - seqlen_q, window_left, window_right)
    if window_left < WINDOW_UNBOUNDED:
        mask = "window"
    elif window_right < WINDOW_UNBOUNDED and seqlen_q > 1:
        mask = "causal" if window_right == 0 else "window"
    else:
        mask = "none"
    device_index = q.get_device()
    group = heads // heads_kv
    packed_rows = seqlen_q * group
    v = variants.resolve(variant) if variant else None
    if v is None and softcap == 0.0 and alibi_slopes is None and sinks is None:
        mods = PLAIN  # the common decode step: no object to build
    else:
        mods = Modifiers(softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, variant=v,
                         variant_tensors=tuple(t for t in (variant_tensor0, variant_tensor1,
                                                           variant_tensor2, variant_tensor3)
                                               if t is not None))
    if v is not None and v.mask_mod:
        mask = v.name
    prefill = packed_rows >= PREFILL_ROWS
    launcher, slots = _plan(device_index, dtype, head_dim, mask, prefill, mods.score_mod)
    attention = None
    # A forced split count, or a variant (whose mask would need block ranges there), runs on the
    # decode kernel, which splits; so do packed queries and left-padded caches, which the
    # forward's cache reads do not take.
    if num_splits == 0 and v is None and not packed and cache_leftpad is None:
        attention = _cache_forward(device_index, dtype, head_dim, mask, batch * heads, seqlen_q,
                                   q, k_cache, v_cache, paged, mods.score_mod)

    # torch.empty throughout: the tests poison it, so an element a kernel forgets shows as NaN.
    out, lse = empty_outputs(q, out)
    if out.numel() == 0:
        return out, lse
    keys = min(capacity, window_left + seqlen_q)  # the most any block's tokens see
    # (launcher, min_seqlen_q, seqlen_q, num_splits) per launch.
    total = q.shape[1] if packed else batch * seqlen_q
    decode_tokens = (mixed_decode_tokens(batch, total, seqlen_q, group)
                     if packed and k_new is None and rotary_cos is None else 0)
    if attention is not None:
        launches = [(launcher, 0, seqlen_q, 0)]  # the decode launch appends only
    elif num_splits:
        launches = [(launcher, 0, seqlen_q, num_splits)]
    elif decode_tokens:
        short, short_slots = _plan(device_index, dtype, head_dim, mask, False, mods.score_mod)
        # The longest sequence is a prefill one: the others hold total - seqlen_q tokens. The
        # prefill launch splits for the longest alone, the one sure to be there (a bound on how
        # many more there may be would split the usual single chunk too little to fill the GPU;
        # further prefill sequences bring blocks of their own).
        launches = [
            (launcher, decode_tokens + 1, seqlen_q,
             _splits(launcher.spec, seqlen_q, 1, seqlen_q, group, heads_kv, keys, slots)),
            (short, 0, decode_tokens,
             _splits(short.spec, total - seqlen_q, batch - 1, decode_tokens, group, heads_kv,
                     keys, short_slots))]
    else:
        launches = [(launcher, 0, seqlen_q,
                     _splits(launcher.spec, total, batch, seqlen_q, group, heads_kv, keys,
                             slots))]
    most_splits = max(splits for *_, splits in launches)
    o_accum = lse_accum = None
    if most_splits > 1:
        # per split, a row per (sequence, head, token) as lse has them
        o_accum = torch.empty((most_splits, *lse.shape, head_dim), dtype=torch.float32,
                              device=q.device)
        lse_accum = torch.empty((most_splits, *lse.shape), dtype=torch.float32, device=q.device)
    rotary = rotary_cos is not None
    q_rot = torch.empty(q.shape, dtype=q.dtype, device=q.device) if rotary else None
    for kernel, min_seqlen_q, launch_seqlen_q, splits in launches:
        args = params.decode_args(
            q=q, k=k_cache, v=v_cache, o=out, softmax_lse=lse.data_ptr(), batch=batch,
            heads=heads, heads_kv=heads_kv, seqlen_q=launch_seqlen_q, seqlen_k=capacity,
            **mods.fields(scale), **band.fields(), num_splits=splits,
            min_seqlen_q=min_seqlen_q,
            cu_seqlens_q=cu_seqlens_q.data_ptr() if packed else 0,
            q_view_rows=q.shape[1] if packed else 0,
            o_accum=0 if o_accum is None else o_accum.data_ptr(),
            lse_accum=0 if lse_accum is None else lse_accum.data_ptr(),
            cache_seqlens=0 if cache_seqlens is None else cache_seqlens.data_ptr(),
            cache_batch_idx=0 if cache_batch_idx is None else cache_batch_idx.data_ptr(),
            cache_leftpad=0 if cache_leftpad is None else cache_leftpad.data_ptr(),
            block_table=block_table.data_ptr() if paged else 0,
            block_table_batch_stride=block_table.stride(0) if paged else 0,
            page_size=k_cache.shape[1] if paged else 0,
            k_new=k_new, v_new=v_new, seqlen_new=0 if k_new is None else k_new.shape[1],
            q_rot=q_rot,
            rotary_cos=rotary_cos.data_ptr() if rotary else 0,
            rotary_sin=rotary_sin.data_ptr() if rotary else 0,
            rotary_dim=2 * rotary_cos.shape[1] if rotary else 0,
            rotary_interleaved=int(rotary_interleaved))
        if attention is None or k_new is not None or rotary:
            host.call_on_device(loader.binding().decode, device_index,
                                (kernel.address, kernel.error_string_address, *args))
    if attention is not None:
        forward_launcher, fields = attention
        cache = {name: getattr(args, name) for name in _CACHE_FIELDS}
        forward.run(forward_launcher, q if q_rot is None else q_rot, k_cache, v_cache, out, lse,
                    scale, band, {**fields, **cache}, batch=batch,
                    seqlen_k=capacity, mods=mods)
    return out, lse


def empty_outputs(q, out=None):
    """decode's out (the caller's buffer where given) and uninitialised lse: (batch, heads,
    seqlen_q) of q's view, so (1, heads, total) for packed queries; the fake implementation calls
    this too."""
    batch, rows, heads, _ = q.shape
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return out, torch.empty((batch, heads, rows), dtype=torch.float32, device=q.device)


_CACHE_FIELDS = tuple(f.name for f in params.KV_CACHE_FIELDS)


@functools.lru_cache(maxsize=256)
def _padded_head_dim(device_index: int, dtype: torch.dtype, head_dim: int) -> int | None:
    """The configured head dim whose decode kernels run a head dim that has none of its own, or
    None where it has its own."""
    props = torch.cuda.get_device_properties(device_index)
    arch = arch_for_capability(props.major, props.minor)
    short = "fp16" if dtype == torch.float16 else "bf16"
    choice = registry.candidates(arch, "kvcache", short, head_dim, "none")[0]
    return choice.spec.head_dim if choice.pad_head_dim else None


_warned_padded: set[int] = set()


def _decode_padded(head_dim: int, q, k_cache, v_cache, k_new, v_new, *arguments, out=None):
    """A head dim without decode kernels of its own runs, as FlashAttention-2 runs it, on
    zero-padded copies (exact: zero columns add nothing to q.k, and the output's padded columns
    are dropped); appended keys and values are copied back into the caller's caches. Copying the
    caches costs a pass over them each call: a config table for the head dim avoids it."""
    width = q.shape[-1]
    if width not in _warned_padded:
        _warned_padded.add(width)
        print(f"flashgen: flash_attn_with_kvcache at head dim {width} runs on copies of the "
              f"caches padded to {head_dim} (configure head dim {width} for its own kernels)",
              file=sys.stderr)

    def pad(t):
        return None if t is None else torch.nn.functional.pad(t, (0, head_dim - width))

    k_padded, v_padded = pad(k_cache), pad(v_cache)
    padded_out, lse = decode(pad(q), k_padded, v_padded, pad(k_new), pad(v_new), *arguments)
    if k_new is not None:
        k_cache.copy_(k_padded[..., :width])
        v_cache.copy_(v_padded[..., :width])
    if out is None:
        return padded_out[..., :width].contiguous(), lse
    out.copy_(padded_out[..., :width])
    return out, lse


def _cache_forward(device_index: int, dtype: str, head_dim: int, mask: str, batch_heads: int,
                   seqlen_q: int, q, k_cache, v_cache, paged: bool, score_mod: str):
    """The (launcher, fields) of a forward that runs this call over the cache (chunked
    prefill), or None for the decode kernel: too few new tokens, no family's forward reads a
    cache at this head dim, pages that are not whole key blocks of its tile, or views its TMA
    descriptors cannot take."""
    if seqlen_q < FORWARD_PREFILL_TOKENS:
        return None
    attention = forward.plan(device_index, dtype, head_dim, mask, batch_heads, seqlen_q, "cache",
                             score_mod)
    if attention is None:
        return None
    if paged and k_cache.shape[1] % attention[0].spec.tile.block_n:
        return None
    if not all(host.is_aligned(t, tma=True) for t in (q, k_cache, v_cache)):
        return None
    return attention


def kernel_for(device: torch.device, dtype: str, head_dim: int, causal: bool, seqlen_q: int,
               group: int = 1, score_mod: str = "none"):
    """The decode kernel a call without a window runs (the bench reports its tile)."""
    mask = "causal" if causal and seqlen_q > 1 else "none"
    return _plan(device.index, dtype, head_dim, mask, seqlen_q * group >= PREFILL_ROWS,
                 score_mod)[0].spec


@functools.lru_cache(maxsize=256)
def _plan(device_index: int, dtype: str, head_dim: int, mask: str, prefill: bool = False,
          score_mod: str = "none"):
    """The decode launcher of this head dim (its own: a cache cannot be padded in place), its
    first alt tile for prefill-sized calls where the config has one, and the blocks of its tile
    the GPU runs at once."""
    props = torch.cuda.get_device_properties(device_index)
    arch = arch_for_capability(props.major, props.minor)
    choices = registry.candidates(arch, "kvcache", dtype, head_dim, mask, score_mod)
    choice = choices[1] if prefill and len(choices) > 1 else choices[0]
    if choice.pad_head_dim:
        raise dispatch.DispatchError(
            f"flashgen: flash_attn_with_kvcache has no kernel for head_dim {head_dim} on {arch} "
            f"(a KV cache is written in place, so it cannot run padded on head dim "
            f"{choice.spec.head_dim}); add a [mma.{arch}.head_dim.{head_dim}.kvcache] table to "
            f"{registry.active_config().path} and run `flashgen generate --arch {arch}`")
    tile = choice.spec.tile
    smem = resources.smem_bytes(head_dim, tile.block_m, tile.block_n, tile.kv_stages)
    # 1 KB of each SM's shared memory is reserved per resident block.
    per_sm = max(1, min(props.shared_memory_per_multiprocessor // (smem + 1024),
                        props.max_threads_per_multi_processor // (32 * tile.warps)))
    return loader.launcher(choice.spec), per_sm * props.multi_processor_count
