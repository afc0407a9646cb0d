"""Attention over a KV cache on validated tensors: one launch of a compiled decode kernel (append
and rotary, split-KV attention, combine), its split of the keys chosen here; or, for chunked
prefill where a family's forward reads the cache (the hopper family), the decode kernel's append
and then that forward."""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

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
    arguments = (q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
                 cache_batch_idx, cache_leftpad, block_table, scale, window_left, window_right,
                 softcap, alibi_slopes, sinks, rotary_interleaved, num_splits, variant,
                 variant_tensor0, variant_tensor1, variant_tensor2, variant_tensor3, cu_seqlens_q,
                 max_seqlen_q, out)
    key = _signature(arguments)
    plan = _plans.get(key)
    if plan is None:
        arguments = _aligned(arguments)
        plan = _make_plan(*arguments)
        if key is not None and plan.reusable:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return _run(plan, arguments)


# A call's plan per shape signature: what decode decides from shapes, strides, dtypes and numbers
# alone, so that a decode step repeated over layers and tokens only allocates and launches.
MAX_PLANS = 1024
_plans: dict = {}
_plan_holders: list = []  # callers' caches of plans (plan_of), forgotten with the plans


def clear_plans() -> None:
    """Forget every call's plan and the kernel choices behind them (after a family's decisions
    or the environment changed)."""
    _plans.clear()
    _plan.cache_clear()
    _padded_head_dim.cache_clear()
    for forget in _plan_holders:
        forget()


def holds_plans(forget) -> None:
    """forget(): drops a caller's plans (plan_of's) when clear_plans forgets decode's own."""
    _plan_holders.append(forget)


def plan_of(arguments: tuple):
    """The plan decode() keeps for a call it ran with these arguments (its own order, without
    out), for run_plan to launch on any call of the same signature; None where it keeps none
    (a variant, an unaligned or padded call, chunked prefill on a forward)."""
    if _padded_head_dim(arguments[0].get_device(), arguments[0].dtype,
                        arguments[0].shape[-1]) is not None:
        return None
    key = _signature((*arguments, None))
    return _plans.get(key) if key is not None else None


def run_plan(plan: _Plan, arguments: tuple, lse_wanted: bool):
    """decode(*arguments) on a plan that plan_of gave for a call of the same signature: out and
    lse (None where not lse_wanted); None, launching nothing, where this call's tensors are not
    all 16-byte aligned (decode() then plans it)."""
    return _run(plan, (*arguments, None), lse_wanted, aligned_only=True)


# Each input source's place in decode's arguments (those _run reads its addresses from).
SOURCE_ARGUMENTS = tuple(decode.__code__.co_varnames.index(name) for name in (
    "q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos", "rotary_sin", "cache_seqlens",
    "cache_batch_idx", "cache_leftpad", "block_table", "alibi_slopes", "sinks", "cu_seqlens_q"))


def replay_parts(plan: _Plan) -> tuple | None:
    """What flashgen/replay.py keeps of a plan to launch it from C++ as _run does: (the input
    sources it reads, the per-call sources' indices (out, lse, q_rot, o_accum, lse_accum,
    split_counters, then their count), per launch (launcher, error string, params bytes, flat
    (byte offset, source, offset) patches), workspace, lse_rows, counters, rotary); None for a
    plan whose attention runs on a forward, which only _run launches."""
    if plan.attention is not None:
        return None
    launches = []
    for launch in plan.launches:
        launcher, error_string, params_bytes, offsets = launch.prepared.parts()
        patches = [value for byte, (_, source, offset) in zip(offsets, launch.addresses)
                   for value in (byte, source, offset)]
        launches.append((launcher, error_string, params_bytes, patches))
    roles = (_O, _LSE, _Q_ROT, _O_ACCUM, _LSE_ACCUM, _COUNTERS, len(_SOURCES))
    return (plan.inputs, roles, tuple(launches), plan.workspace, plan.lse_rows, plan.counters,
            plan.rotary)


def _signature(arguments: tuple):
    """The key of a call's plan: each tensor's shape, strides and dtype, the other arguments as
    they are; None (plan the call apart) for a variant's call, whose mask and tensors are
    planned per call, or where an address is not 16-byte aligned, which the plan may copy."""
    if arguments[_VARIANT]:
        return None
    key, addresses = [arguments[0].get_device()], 0
    for value in arguments:
        if isinstance(value, torch.Tensor):  # a subclass too (sinks as an nn.Parameter)
            key.append((value.shape, value.stride(), value.dtype))
            addresses |= value.data_ptr()
        else:
            key.append(value)
    return tuple(key) if addresses % 16 == 0 else None


class _Launch(NamedTuple):
    args: list       # DecodeArgs in order, with this plan's call's addresses
    addresses: tuple  # (index in args, index in _run's sources, byte offset) per address
    prepared: object  # the binding's PreparedDecode: args, taking each call's addresses


class _Plan(NamedTuple):
    launches: tuple       # _Launch per decode launch (append, then split attention)
    workspace: int        # fp32 elements of the split workspace (o_accum, then lse_accum)
    lse_rows: int         # fp32 elements of softmax_lse
    counters: int         # split counters the launches need (split_counters)
    inputs: tuple         # indices in _SOURCES of the call's tensors that the launches read
    rotary: bool          # q rotated into a q_rot buffer
    attention: tuple | None  # (forward launcher, fields) where a forward attends over the cache
    mods: Modifiers | None  # the forward's over the cache, with attention
    band: Band | None
    reusable: bool        # for any call of the same signature: _run sets every address


# What _run fills each address field from: its sources (the call's arguments, its outputs and
# workspaces) in this order.
_SOURCES = ("q", "k", "v", "k_new", "v_new", "rotary_cos", "rotary_sin", "cache_seqlens",
            "cache_batch_idx", "cache_leftpad", "block_table", "alibi_slopes", "sinks",
            "cu_seqlens_q", "o", "softmax_lse", "q_rot", "o_accum", "lse_accum",
            "split_counters")
_O, _LSE, _Q_ROT, _O_ACCUM, _LSE_ACCUM, _COUNTERS = (_SOURCES.index(name) for name in (
    "o", "softmax_lse", "q_rot", "o_accum", "lse_accum", "split_counters"))
_ADDRESS_MEMBERS = tuple(name for ctype, name in params.members(params.DECODE_FIELDS)
                         if ctype.endswith("*"))


def _aligned(arguments: tuple) -> tuple:
    """The arguments with q, k_new and v_new copied where host.aligned copies them; an error for
    caches that are not aligned (written in place, they cannot be copied). Here, not in the
    traced wrapper: alignment reads data pointers, which fake tensors lack."""
    q, k_cache, v_cache, k_new, v_new = arguments[:5]
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not host.is_aligned(t):
            raise ValueError(f"flashgen: {name} must start at a 16-byte boundary with every "
                             f"stride a multiple of 8 elements (it is written in place, so it "
                             f"cannot be copied), got strides {t.stride()}")
    if k_new is None:
        (q,) = host.aligned(q)
    else:
        q, k_new, v_new = host.aligned(q, k_new, v_new)
    return (q, k_cache, v_cache, k_new, v_new, *arguments[5:])


class _Contiguous(NamedTuple):
    """A stand-in, at planning, for a contiguous output _run allocates per call: its strides,
    and an address that _run replaces."""
    shape: tuple

    def stride(self) -> tuple:
        strides, step = [], 1
        for size in reversed(self.shape):
            strides.insert(0, step)
            step *= size
        return tuple(strides)

    def data_ptr(self) -> int:
        return 0


def _run(plan: _Plan, arguments: tuple, lse_wanted: bool = True, aligned_only: bool = False):
    """Allocates the call's outputs and workspaces and launches the plan on its tensors: out and
    lse (None where not lse_wanted: lse then shares one allocation with the workspace). None,
    launching nothing, where aligned_only and an input's address is not a multiple of 16 bytes
    (a plan made for aligned tensors; decode() plans such a call apart)."""
    q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, \
        cache_leftpad, block_table, scale, _, _, _, alibi_slopes, sinks, *_, \
        cu_seqlens_q, _, out = arguments
    inputs = (q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
              cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sinks, cu_seqlens_q)
    addresses, bits = [0] * len(_SOURCES), 0
    for i in plan.inputs:
        addresses[i] = address = inputs[i].data_ptr()
        bits |= address
    if aligned_only and bits % 16:
        return None
    lse_wanted = lse_wanted or plan.attention is not None  # the forward writes lse
    # Uninitialised allocations throughout: the tests poison them, so an element a kernel
    # forgets shows as NaN.
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # 2 us, not 4 (H200)
    lse = (torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32,
                       device=q.device) if lse_wanted else None)
    if out.numel() == 0:
        return out, lse
    device_index = q.get_device()
    stream = stream_of(device_index)
    # What the launch alone reads and writes (the split workspace, lse's rows where the caller
    # wants none) lives in the stream's scratch: no allocation per call (2 to 5 us each, H200).
    floats = plan.workspace + (0 if lse_wanted else plan.lse_rows)
    scratch = None  # held until the launches are queued: a capture's own is freed after them
    if floats:
        scratch = stream_scratch(q.device, stream, floats)
        address = scratch.data_ptr()
        addresses[_O_ACCUM] = addresses[_LSE_ACCUM] = address
        addresses[_LSE] = address + 4 * plan.workspace
    if lse_wanted:
        addresses[_LSE] = lse.data_ptr()
    addresses[_O] = out.data_ptr()
    q_rot = None
    if plan.rotary:
        q_rot = torch.empty_like(q, memory_format=torch.contiguous_format)
        addresses[_Q_ROT] = q_rot.data_ptr()
    counters = None
    if plan.counters:
        counters = split_counters(q.device, stream, plan.counters)
        addresses[_COUNTERS] = counters.data_ptr()
    if plan.attention is None or k_new is not None or plan.rotary:
        for launch in plan.launches:
            host.call_on_device(launch.prepared, device_index,
                                [addresses[source] + offset
                                 for _, source, offset in launch.addresses])
    if plan.attention is not None:
        args = plan.launches[-1].args.copy()
        for index, source, offset in plan.launches[-1].addresses:
            args[index] = addresses[source] + offset
        forward_launcher, fields = plan.attention
        cache = dict(zip(_CACHE_FIELDS, (args[i] for i in _CACHE_INDICES)))
        forward.run(forward_launcher, q if q_rot is None else q_rot, k_cache, v_cache, out, lse,
                    scale, plan.band, {**fields, **cache}, batch=args[_BATCH],
                    seqlen_k=args[_SEQLEN_K], mods=plan.mods)
    return out, lse


def stream_of(device_index: int):
    """The key of the device's current stream for split_counters and stream_scratch: None while
    it captures a CUDA graph, whose buffers are its own."""
    if host.stream_capturing():
        return None
    return device_index, host._current_stream(device_index)


def split_counters(device: torch.device, stream, count: int) -> torch.Tensor:
    """At least `count` int32 counters at 0 for a split launch on `stream` (stream_of's), which
    the launch leaves at 0 again: one buffer per stream (the launches on a stream run one after
    the other), and a CUDA graph's own, zeroed as it replays, in a capture."""
    return _stream_buffer(_split_counters, torch.zeros, torch.int32, device, stream, count, 1024)


def stream_scratch(device: torch.device, stream, floats: int) -> torch.Tensor:
    """At least `floats` uninitialised fp32 for one launch on `stream` (stream_of's), which no
    later launch on it overlaps: one buffer per stream, up to SCRATCH_KEPT floats (a larger one,
    and one in a CUDA graph's capture, is the call's own)."""
    if floats > SCRATCH_KEPT:
        return torch.empty((floats,), dtype=torch.float32, device=device)
    return _stream_buffer(_scratch, torch.empty, torch.float32, device, stream, floats, 1 << 16)


SCRATCH_KEPT = 1 << 24  # 64 MB
_split_counters: dict = {}
_scratch: dict = {}


def _stream_buffer(buffers: dict, make, dtype, device, stream, size: int,
                   smallest: int) -> torch.Tensor:
    if stream is None:
        return make((size,), dtype=dtype, device=device)
    buffer = buffers.get(stream)
    if buffer is None or buffer.numel() < size:
        buffer = buffers[stream] = make((max(size, smallest),), dtype=dtype, device=device)
    return buffer


def _make_plan(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table, scale, window_left, window_right,
               softcap, alibi_slopes, sinks, rotary_interleaved, num_splits, variant,
               variant_tensor0, variant_tensor1, variant_tensor2, variant_tensor3, cu_seqlens_q,
               max_seqlen_q, out) -> _Plan:
    """decode's decisions for a call on aligned tensors (_aligned): kernels, tiles, splits and
    every params field, the addresses as this call's (which _run replaces with each call's
    own)."""
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
    # per split, a row per (sequence, head, token) as lse has them: o_accum, then lse_accum
    lse_rows = q.shape[0] * heads * q.shape[1]
    workspace = most_splits * lse_rows * (head_dim + 1) if most_splits > 1 else 0
    rotary = rotary_cos is not None
    o = out if out is not None else _Contiguous(tuple(q.shape))
    planned, most_counters = [], 0
    for kernel, min_seqlen_q, launch_seqlen_q, splits in launches:
        # A counter per (query block, sequence and KV head) of a split launch's grid, at most a
        # dense batch's (packed_blocks.cuh's DecodeBlocks)
        counters = (heads_kv * batch * -(-launch_seqlen_q * group // kernel.spec.tile.block_m)
                    if splits > 1 else 0)
        most_counters = max(most_counters, counters)
        args = params.decode_args(
            q=q, k=k_cache, v=v_cache, o=o, softmax_lse=0, batch=batch,
            heads=heads, heads_kv=heads_kv, seqlen_q=launch_seqlen_q, seqlen_k=capacity,
            **mods.fields(scale), **band.fields(), num_splits=splits,
            min_seqlen_q=min_seqlen_q,
            cu_seqlens_q=cu_seqlens_q.data_ptr() if packed else 0,
            q_view_rows=q.shape[1] if packed else 0,
            o_accum=0, lse_accum=0, split_counters=0, split_counter_count=counters,
            cache_seqlens=0 if cache_seqlens is None else cache_seqlens.data_ptr(),
            cache_batch_idx=0 if cache_batch_idx is None else cache_batch_idx.data_ptr(),
            cache_leftpad=0 if cache_leftpad is None else cache_leftpad.data_ptr(),
            block_table=block_table.data_ptr() if paged else 0,
            block_table_batch_stride=block_table.stride(0) if paged else 0,
            page_size=k_cache.shape[1] if paged else 0,
            k_new=k_new, v_new=v_new, seqlen_new=0 if k_new is None else k_new.shape[1],
            q_rot=_Contiguous(tuple(q.shape)) if rotary else None,
            rotary_cos=rotary_cos.data_ptr() if rotary else 0,
            rotary_sin=rotary_sin.data_ptr() if rotary else 0,
            rotary_dim=2 * rotary_cos.shape[1] if rotary else 0,
            rotary_interleaved=int(rotary_interleaved))
        present = {"q": q, "k": k_cache, "v": v_cache, "k_new": k_new, "v_new": v_new,
                   "rotary_cos": rotary_cos, "rotary_sin": rotary_sin,
                   "cache_seqlens": cache_seqlens, "cache_batch_idx": cache_batch_idx,
                   "cache_leftpad": cache_leftpad, "block_table": block_table,
                   "alibi_slopes": alibi_slopes, "sinks": sinks, "cu_seqlens_q": cu_seqlens_q,
                   # the outputs and workspaces, allocated per call
                   "o": True, "softmax_lse": True, "q_rot": rotary or None,
                   "o_accum": workspace or None, "lse_accum": workspace or None,
                   "split_counters": counters or None}
        offsets = {"lse_accum": 4 * most_splits * lse_rows * head_dim}
        addresses = tuple((params.DecodeArgs._fields.index(name), _SOURCES.index(name),
                           offsets.get(name, 0))
                          for name in _SOURCES if present[name] is not None)
        planned.append(_Launch(
            list(args), addresses,
            loader.binding().prepare_decode(kernel.address, kernel.error_string_address,
                                            [index for index, _, _ in addresses], *args)))
    # A launch's other addresses (a variant's tensors) are this call's, and so are the
    # forward's modifiers over a cache (chunked prefill, whose host time its work hides): such a
    # plan is its call's own.
    set_here = {params.DecodeArgs._fields[index] for index, _, _ in planned[0].addresses}
    reusable = attention is None and all(
        planned[0].args[params.DecodeArgs._fields.index(name)] == 0
        for name in _ADDRESS_MEMBERS if name not in set_here)
    # A kept plan holds no tensor of the call that made it (its modifiers' are re-read).
    inputs = tuple(i for i, name in enumerate(_SOURCES[:_O]) if present[name] is not None)
    return _Plan(tuple(planned), workspace, lse_rows, most_counters, inputs, rotary, attention,
                 mods if attention else None, band if attention else None, reusable)


def empty_outputs(q, out=None):
    """decode's out (the caller's buffer where given) and uninitialised lse: (batch, heads,
    seqlen_q) of q's view, so (1, heads, total) for packed queries; the fake implementation calls
    this too."""
    batch, rows, heads, _ = q.shape
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # 2 us, not 4 (H200)
    return out, torch.empty((batch, heads, rows), dtype=torch.float32, device=q.device)


_CACHE_FIELDS = tuple(f.name for f in params.KV_CACHE_FIELDS)
_VARIANT = decode.__code__.co_varnames.index("variant")  # its place in decode's arguments
_CACHE_INDICES = tuple(params.DecodeArgs._fields.index(name) for name in _CACHE_FIELDS)
_BATCH = params.DecodeArgs._fields.index("batch")
_SEQLEN_K = params.DecodeArgs._fields.index("seqlen_k")


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
