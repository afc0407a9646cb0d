"""Serving: FlashAttention-2's flash_attn_with_kvcache (a KV cache, contiguous or paged with any
page size, appended to in place, with rotary embeddings; split-KV decoding)."""

from __future__ import annotations

import operator
from typing import Callable

import torch

from flashgen import decode, host, op_schema, ops, replay, validate, variant_args
from flashgen.modifiers import PLAIN


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, s_aux=None, learnable_sink=None,
                            variant=None, variant_tensors=None):
    """Attention of new queries over a KV cache, FlashAttention-2's interface.

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache,
    nheads_k, headdim), or with block_table (num_pages, page_size, nheads_k, headdim), any page
    size; nheads a multiple of nheads_k. k, v (optional): (batch, seqlen_new, nheads_k, headdim),
    written into the caches in place at positions cache_seqlens .. cache_seqlens + seqlen_new - 1
    before attending (keys rotated when rotary_cos/rotary_sin are given). rotary_cos, rotary_sin:
    (seqlen_ro, rotary_dim / 2) in q's dtype; rotary_interleaved pairs columns (2i, 2i + 1),
    else (i, i + rotary_dim / 2). q is rotated at positions cache_seqlens + i when causal, else
    all at cache_seqlens. cache_seqlens: int or (batch,) int32, the keys already cached (None:
    the whole cache). cache_batch_idx: (batch,) int32, each sequence's row of a contiguous
    cache. cache_leftpad: (batch,) int32, a contiguous cache's first key of each sequence (its
    keys are cache_leftpad .. cache_seqlens + seqlen_new - 1; masks and ALiBi count from it,
    new keys and rotary positions do not), as FlashAttention-2's. block_table: (batch,
    max_pages) int32. s_aux (or learnable_sink): (nheads,) fp32 sink logits that join each row's
    softmax denominator (gpt-oss). num_splits: 0 chooses how many blocks share
    each sequence's keys (and lets calls of 256 or more new tokens attend on a forward that
    reads the cache, the hopper family on sm_90, where the pages are whole key blocks), N forces
    N on the decode kernel. The causal mask and window_size (as in flash_attn_func) are aligned
    bottom-right to each sequence's keys; softcap and alibi_slopes as in flash_attn_func
    (ALiBi's distance aligned bottom-right too). variant="name" and variant_tensors run a
    config-defined variant whose table sets kvcache = true (codegen/variants.py): q_idx is a new
    token's position in its sequence (cached keys before it), kv_idx a key's; its tensors'
    seqlen_k is the cache's capacity; a mask_mod runs on every cached key (no block is skipped).
    Returns out (batch, seqlen_q, nheads, headdim), and with return_softmax_lse (out,
    softmax_lse), lse (batch, nheads, seqlen_q) fp32. Not differentiable. CUDA-graph safe:
    nothing on the device is read on the host (FLASHGEN_DEBUG_CHECKS=1 reads and checks it).
    """
    if variant is None and variant_tensors is None and ops.nothing_sees_ops():
        ran = replay.decode(return_softmax_lse, q, k_cache, v_cache, k, v, rotary_cos,
                            rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                            block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, num_splits, s_aux, learnable_sink)
        if ran is not None:
            return ran
    given = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
             cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
             rotary_interleaved, alibi_slopes, num_splits, s_aux, learnable_sink)
    key = None
    if (variant is None and variant_tensors is None and not validate.debug_checks()
            and not torch.compiler.is_compiling()):  # dynamo traces no itemgetter
        key = _signature(given)
    known = _known.get(key) if key is not None else None
    if known is None:
        arguments = _arguments(*given, variant, variant_tensors)
        out, lse = ops.attention_with_kvcache(arguments)
        if key is not None:
            known = _known_call(arguments, given)
            if known is not None:
                known.offered = _replay(known, given)
                if len(_known) >= MAX_RECIPES:
                    _known.clear()
                _known[key] = known
    else:
        arguments = known.arguments(given + known.values)
        ran = None
        if known.plan is not None and ops.nothing_sees_ops():
            if known.offered != replay.generation:  # not loaded then, or it forgot since
                known.offered = _replay(known, given)
            ran = decode.run_plan(known.plan, arguments, return_softmax_lse)
        out, lse = ran if ran is not None else ops.attention_with_kvcache(arguments)
    return (out, lse) if return_softmax_lse else out


# The checks of a call depend on its tensors' kinds, shapes and strides and on its other arguments'
# values alone (the device values' checks run apart, under FLASHGEN_DEBUG_CHECKS=1), so a call of
# a signature that passed once passes again: its kernel arguments are kept as a recipe, each the
# same value again or the call's own tensor at a position of its arguments, with the plan decode
# ran it on, which the next such call launches directly. A call that makes a tensor (an int
# cache_seqlens, a contiguous copy) keeps none.
MAX_RECIPES = 1024
_known: dict = {}
# Where the call's tensors are in `given` (flash_attn_with_kvcache's): q, k_cache, v_cache, k, v,
# rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
# alibi_slopes, s_aux, learnable_sink.
_TENSOR_ARGUMENTS = frozenset((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 18, 19))
_signature = host.Signature(tuple(sorted(_TENSOR_ARGUMENTS)), 20)


class _Known:
    __slots__ = ("arguments", "values", "positions", "plan", "offered")

    def __init__(self, arguments: Callable, values: tuple, positions: tuple, plan):
        self.arguments = arguments  # (given + values) -> the op's arguments
        self.values = values        # the arguments that are none of the call's tensors
        self.positions = positions  # each of the op's arguments' index in given + values
        self.plan = plan            # decode's plan for the call (ops.kvcache_plan), or None
        self.offered = -1           # replay.generation when offered to the compiled replay


def clear_recipes() -> None:
    _known.clear()
    replay.forget()


decode.holds_plans(clear_recipes)


def _known_call(arguments: tuple, given: tuple) -> _Known | None:
    """The recipe of a call that ran: each argument that is one of the call's tensors picked
    from its position in given, the rest from values; None where a tensor is none of the call's
    or more than one."""
    positions, values = [], []
    for value in arguments:
        if isinstance(value, torch.Tensor):
            found = [i for i in _TENSOR_ARGUMENTS if given[i] is value]
            if len(found) != 1:
                return None
            positions.append(found[0])
        else:
            positions.append(len(given) + len(values))
            values.append(value)
    return _Known(operator.itemgetter(*positions), tuple(values), tuple(positions),
                  ops.kvcache_plan(arguments))


def _replay(known: _Known, given: tuple) -> int:
    """Offers a known call's plan to the compiled replay, its inputs read from given: the
    replay's generation where it was loaded to be offered it (it may still keep none: a plan
    on a forward, an argument its match does not compare), else -1."""
    if not replay.ready():
        return -1
    parts = decode.replay_parts(known.plan) if known.plan is not None else None
    if parts is not None:
        positions = {source: known.positions[decode.SOURCE_ARGUMENTS[source]]
                     for source in parts[0]}
        replay.keep_decode(given, parts, positions)
    return replay.generation


def _arguments(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
               cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
               rotary_interleaved, alibi_slopes, num_splits, s_aux, learnable_sink, variant,
               variant_tensors) -> tuple:
    """flashgen::fwd_kvcache's arguments for a call, checked (raising what is wrong)."""
    validate.check_qkv(("q", "k_cache", "v_cache"), q, k_cache, v_cache)
    batch, seqlen_q, heads, head_dim = q.shape
    mods = (validate.modifiers(softcap, alibi_slopes, q, batch)
            if softcap or alibi_slopes is not None else PLAIN)
    mods = validate.with_sinks(mods, validate.sink_argument(s_aux, learnable_sink), q)
    cache_rows, rows_per_page, heads_kv = _check_caches(k_cache, v_cache, heads, head_dim)
    capacity = _check_layout(q, cache_rows, rows_per_page, block_table, cache_batch_idx, batch)
    if cache_batch_idx is not None:
        cache_batch_idx = cache_batch_idx.contiguous()  # the kernels index it densely
    seqlen_new = _check_new(q, k, v, batch, heads_kv, head_dim)
    rotary_cos, rotary_sin = _check_rotary(q, rotary_cos, rotary_sin, k, capacity, head_dim)
    cache_seqlens = _check_cache_seqlens(q, cache_seqlens, batch, seqlen_new, capacity, k,
                                         block_table)
    if cache_leftpad is not None:
        cache_leftpad = _check_leftpad(q, cache_leftpad, block_table, batch)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"flashgen: num_splits must be an int >= 0 (0: chosen per call), got "
                         f"{num_splits!r}")
    if num_splits > 65535:
        raise ValueError(f"flashgen: num_splits={num_splits} is more than 65535")
    scale = validate.check_scale(softmax_scale, head_dim)
    # Bounds that hide nothing for any sequence of the cache's capacity count as unbounded.
    mask, band = validate.band(causal, window_size, seqlen_q, capacity, capacity - seqlen_q)
    name, tensors = "", ()
    if variant is not None or variant_tensors is not None:
        name, tensors = variant_args.prepare_decode(variant, variant_tensors, q, k_cache,
                                                    batch, seqlen_q, capacity, mask, mods)
    if validate.debug_checks():
        _check_device_values(cache_seqlens, cache_batch_idx, block_table, seqlen_new, capacity,
                             cache_rows, rows_per_page, cache_leftpad)
    return op_schema.fwd_kvcache_arguments(
        q=q, k_cache=k_cache, v_cache=v_cache, k_new=k, v_new=v, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, block_table=block_table, scale=scale,
        window_left=band.left, window_right=band.right, softcap=mods.softcap,
        alibi_slopes=mods.alibi_slopes, sinks=mods.sinks,
        rotary_interleaved=bool(rotary_interleaved), num_splits=num_splits, variant=name,
        variant_tensors=tensors)


def _check_caches(k_cache, v_cache, heads: int, head_dim: int) -> tuple[int, int, int]:
    """The caches' (rows or pages, keys per row or page, heads_kv), checked against q's heads and
    head dim."""
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"flashgen: k_cache and v_cache must have the same shape, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    rows, rows_per_page, heads_kv, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"flashgen: q's head dim {head_dim} and k_cache's {cache_head_dim} "
                         f"differ")
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"flashgen: the number of query heads ({heads}) must be a multiple of "
                         f"k_cache's heads ({heads_kv})")
    return rows, rows_per_page, heads_kv


def _int32_vector(name: str, t, q, length: int, what: str):
    validate.check_int32(name, t, q)
    if t.shape != (length,):
        raise ValueError(f"flashgen: {name} must have shape ({length},) ({what}), got "
                         f"{tuple(t.shape)}")
    return t.contiguous()


def _check_layout(q, cache_rows, rows_per_page, block_table, cache_batch_idx, batch) -> int:
    """The cache's capacity per sequence, in keys."""
    if block_table is None:
        if cache_batch_idx is None and cache_rows < batch:
            raise ValueError(f"flashgen: k_cache has {cache_rows} rows for a batch of {batch}; "
                             f"pass cache_batch_idx to choose rows")
        if cache_batch_idx is not None:
            _int32_vector("cache_batch_idx", cache_batch_idx, q, batch, "a cache row per sequence")
        return rows_per_page
    if cache_batch_idx is not None:
        raise ValueError("flashgen: cache_batch_idx selects rows of a contiguous cache; with "
                         "block_table the table itself says where each sequence's pages are")
    validate.check_int32("block_table", block_table, q)
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"flashgen: block_table must be (batch={batch}, max_pages), got "
                         f"{tuple(block_table.shape)}")
    if block_table.stride(1) != 1 and block_table.shape[1] > 1:
        raise ValueError("flashgen: block_table's rows must be contiguous; pass "
                         "block_table.contiguous()")
    if rows_per_page == 0:
        raise ValueError("flashgen: a paged k_cache must have pages of at least one key")
    return block_table.shape[1] * rows_per_page


def _check_leftpad(q, cache_leftpad, block_table, batch):
    if block_table is not None:
        raise ValueError("flashgen: cache_leftpad left-pads a contiguous cache; a paged one "
                         "starts each sequence where its block table's first page does")
    return _int32_vector("cache_leftpad", cache_leftpad, q, batch,
                         "each sequence's first key in the cache")


def _check_new(q, k, v, batch, heads_kv, head_dim) -> int:
    if (k is None) != (v is None):
        raise ValueError("flashgen: pass k and v together (the new keys and values), or neither")
    if k is None:
        return 0
    validate.check_qkv(("q", "k", "v"), q, k, v)
    if k.shape != v.shape or k.shape[0] != batch or k.shape[2:] != (heads_kv, head_dim):
        raise ValueError(f"flashgen: k and v must be (batch={batch}, seqlen_new, "
                         f"nheads_k={heads_kv}, headdim={head_dim}), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    return k.shape[1]


def _check_rotary(q, cos, sin, k, capacity, head_dim):
    if cos is None and sin is None:
        return None, None
    if cos is None or sin is None:
        raise ValueError("flashgen: pass rotary_cos and rotary_sin together")
    if k is None:
        raise ValueError("flashgen: rotary_cos/rotary_sin rotate the new keys k (and q): pass k "
                         "and v with them, or rotate q yourself")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"flashgen: {name} must be a 2-D tensor (seqlen_ro, rotary_dim / 2)")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"flashgen: {name} must have q's dtype and device ({q.dtype}, "
                            f"{q.device}), got {t.dtype}, {t.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"flashgen: rotary_cos {tuple(cos.shape)} and rotary_sin "
                         f"{tuple(sin.shape)} must have one shape")
    seqlen_ro, half = cos.shape
    if half == 0 or 2 * half > head_dim:
        raise ValueError(f"flashgen: rotary_dim = 2 * rotary_cos.shape[1] = {2 * half} must be "
                         f"in 2..headdim ({head_dim})")
    if seqlen_ro < capacity:
        raise ValueError(f"flashgen: rotary_cos/rotary_sin have {seqlen_ro} positions, fewer "
                         f"than the cache's {capacity}; they need a row for every position a key "
                         f"can take")
    return cos.contiguous(), sin.contiguous()


def _holds(capacity: int, block_table) -> str:
    """What bounds a sequence's keys: the cache's length, or its block table's pages."""
    if block_table is None:
        return f"the cache holds {capacity} positions"
    return (f"block_table holds {block_table.shape[1]} pages of {capacity // block_table.shape[1]}"
            f" keys per sequence: {capacity} positions")


def _check_cache_seqlens(q, cache_seqlens, batch, seqlen_new, capacity, k, block_table):
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("flashgen: with new keys k and v, pass cache_seqlens: where in the "
                             "cache they go")
        return None
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= capacity - seqlen_new:
            raise ValueError(f"flashgen: cache_seqlens={cache_seqlens} plus {seqlen_new} new "
                             f"keys does not fit: {_holds(capacity, block_table)}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    return _int32_vector("cache_seqlens", cache_seqlens, q, batch, "the keys cached per sequence")


def _check_device_values(cache_seqlens, cache_batch_idx, block_table, seqlen_new, capacity,
                         cache_rows, page_size, cache_leftpad=None,
                         seqlens_name="cache_seqlens") -> None:
    """FLASHGEN_DEBUG_CHECKS=1: what lives on the device, read back (a sync; not in graphs).
    Only the block-table entries a call reads are checked: engines mark unused ones (-1, say)."""
    lengths = None
    if cache_seqlens is not None:
        low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
        if low < 0 or high + seqlen_new > capacity:
            raise ValueError(f"flashgen: {seqlens_name} spans {low}..{high}; with {seqlen_new} "
                             f"new keys each must lie in 0..{capacity - seqlen_new} "
                             f"({_holds(capacity, block_table)})")
        lengths = cache_seqlens.long() + seqlen_new
    if cache_leftpad is not None and cache_leftpad.numel():
        starts = cache_leftpad.long()
        ends = (cache_seqlens.long() if cache_seqlens is not None
                else torch.full_like(starts, capacity - seqlen_new))
        bad = (starts < 0) | (starts > ends)
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            raise ValueError(f"flashgen: cache_leftpad[{row}] = {int(starts[row])} must lie in "
                             f"0..cache_seqlens[{row}] = {int(ends[row])} (the first key cannot "
                             f"come after the cached ones)")
    if cache_batch_idx is not None and cache_batch_idx.numel():
        low, high = int(cache_batch_idx.min()), int(cache_batch_idx.max())
        if low < 0 or high >= cache_rows:
            raise ValueError(f"flashgen: cache_batch_idx holds {low}..{high}, outside the "
                             f"cache's {cache_rows} rows")
    if block_table is not None and block_table.numel():
        pages = torch.arange(block_table.shape[1], device=block_table.device)
        used = (block_table.new_ones(block_table.shape, dtype=torch.bool) if lengths is None
                else pages[None, :] * page_size < lengths[:, None])
        bad = used & ((block_table < 0) | (block_table >= cache_rows))
        if bool(bad.any()):
            row, page = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"flashgen: block_table[{row}, {page}] = "
                             f"{int(block_table[row, page])} is not a page of k_cache (it has "
                             f"{cache_rows})")


def paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                 max_seqlen_k, block_table, softmax_scale, causal, window_size, softcap,
                 alibi_slopes, sinks, num_splits, out):
    """flash_attn_varlen_func over a paged cache (the call vLLM's FlashAttention backend makes):
    q (total_q, nheads, headdim) packed by cu_seqlens_q, over k_cache and v_cache (num_pages,
    page_size, nheads_k, headdim) and block_table (batch, max_pages) int32; each sequence's keys
    are its first seqused_k[b] ((batch,) int32), else cu_seqlens_k[b + 1] - cu_seqlens_k[b].
    Runs on the KV-cache kernels, which take a mix of prefill and decode rows in one launch;
    nothing on the device is read on the host, so a CUDA graph replays it with new lengths and
    tables. Returns out (the caller's buffer where given) and lse (nheads, total_q) fp32."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        want = 3 if name == "q" else 4
        if isinstance(t, torch.Tensor) and t.dim() != want:
            layout = ("(total_q, nheads, headdim)" if name == "q"
                      else "(num_pages, page_size, nheads_k, headdim) with block_table")
            raise ValueError(f"flashgen: {name} must be {layout}, got shape {tuple(t.shape)}")
    q4 = q.unsqueeze(0) if isinstance(q, torch.Tensor) else q
    validate.check_qkv(("q", "k_cache", "v_cache"), q4, k_cache, v_cache)
    total_q, heads, head_dim = q.shape
    pages, page_size, _ = _check_caches(k_cache, v_cache, heads, head_dim)
    validate.check_int32("cu_seqlens_q", cu_seqlens_q, q)
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"flashgen: cu_seqlens_q must be 1-D with batch + 1 entries, got shape "
                         f"{tuple(cu_seqlens_q.shape)}")
    batch = cu_seqlens_q.shape[0] - 1
    cu_seqlens_q = cu_seqlens_q.contiguous()
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise ValueError(f"flashgen: max_seqlen_q must be an int >= 0 (the longest query "
                         f"sequence), got {max_seqlen_q!r}")
    capacity = _check_layout(q4, pages, page_size, block_table, None, batch)
    if seqused_k is not None:
        lengths = _int32_vector("seqused_k", seqused_k, q, batch, "the keys each sequence uses")
    elif cu_seqlens_k is not None:
        validate.check_int32("cu_seqlens_k", cu_seqlens_k, q)
        if cu_seqlens_k.shape != (batch + 1,):
            raise ValueError(f"flashgen: cu_seqlens_k must have shape ({batch + 1},) as "
                             f"cu_seqlens_q, got {tuple(cu_seqlens_k.shape)}")
        lengths = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    else:
        raise ValueError("flashgen: with block_table, pass seqused_k (or cu_seqlens_k): the "
                         "keys each sequence has in its pages")
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"flashgen: num_splits must be an int >= 0 (0: chosen per call), got "
                         f"{num_splits!r}")
    if out is not None:
        validate.check_out(out, q)
    scale = validate.check_scale(softmax_scale, head_dim)
    mask, band = validate.band(causal, window_size, max_seqlen_q, capacity,
                               capacity - max_seqlen_q)
    mods = (validate.modifiers(softcap, alibi_slopes, q4, batch)
            if softcap or alibi_slopes is not None else PLAIN)
    mods = validate.with_sinks(mods, sinks, q4)
    if validate.debug_checks():
        starts = cu_seqlens_q.tolist()
        if starts[0] != 0 or starts[-1] != total_q or any(
                b < a or b - a > max_seqlen_q for a, b in zip(starts, starts[1:])):
            raise ValueError(f"flashgen: cu_seqlens_q must rise from 0 to total_q = {total_q} "
                             f"in steps of at most max_seqlen_q = {max_seqlen_q}, got {starts}")
        _check_device_values(lengths, None, block_table, 0, capacity, pages, page_size,
                             seqlens_name="seqused_k" if seqused_k is not None
                             else "cu_seqlens_k's lengths")
    out4, lse = ops.attention_with_kvcache(op_schema.fwd_kvcache_arguments(
        q=q4, k_cache=k_cache, v_cache=v_cache, k_new=None, v_new=None, rotary_cos=None,
        rotary_sin=None, cache_seqlens=lengths, cache_batch_idx=None, cache_leftpad=None,
        block_table=block_table, scale=scale, window_left=band.left, window_right=band.right,
        softcap=mods.softcap, alibi_slopes=mods.alibi_slopes, sinks=mods.sinks,
        rotary_interleaved=False, num_splits=num_splits, variant="", variant_tensors=(),
        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q),
        out=None if out is None else out.unsqueeze(0))
    return out4.squeeze(0), lse.squeeze(0)
