"""The forward pass on (batch, seq, heads, dim) views: out and the log-sum-exp of each query row,
from one compiled kernel of the best configured family (dispatch.py), the tile its family picks
for the call's shape."""

from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import torch

from codegen import params
from codegen.arch import arch_for_capability
from codegen.spec import KernelSpec
from flashgen import families, host, loader, registry
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers


def forward(q, k, v, dtype: str, scale: float, mask: str, band: Band, heads_first: bool,
            cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
            max_seqlen_k=0, *, mods: Modifiers = PLAIN):
    """out (q's shape and dtype, laid out by host.empty_output) and lse (batch, heads,
    seqlen_q) fp32.

    q, k, v: validated (batch, seq, heads, dim) views of one fp16/bf16 dtype (`dtype` is its short
    name). mask: a mask kind (codegen/masks.py); under "causal", key j is visible to query i iff
    i + band.offset - band.left <= j <= i + band.offset + band.right. mods: the score modifier,
    the variant and their arguments (flashgen/modifiers.py's Modifiers). With cu_seqlens_q and
    cu_seqlens_k (int32, batch + 1) the views are a variable-length batch packed as (1, total,
    heads, dim), its longest sequences max_seqlen_q and
    max_seqlen_k, each sequence's band aligned bottom-right; lse is then (1, heads, total_q);
    seqused_k ((batch,) int32, with them) the keys each sequence attends to, the first of its
    run. mods.sinks join each row's denominator (a row without keys: out 0, lse its sink).
    """
    key = None
    varlen = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k, seqused_k)
    if without_tensors(mods):
        key = _key(q, k, v, scale, mask, band, heads_first, mods, varlen)
        kept = _kept.get(key)
        if kept is not None:
            ran = run_kept(kept, q, k, v, heads_first, sequence_tensors(varlen))
            if ran is not None:
                return ran
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    sequences = None
    if cu_seqlens_q is not None:  # the kernels read the batch's sizes from these, not the views
        sequences = (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), cu_seqlens_q.shape[0] - 1,
                     max_seqlen_q, max_seqlen_k, 0 if seqused_k is None else seqused_k.data_ptr())
        batch, seqlen_q = sequences[2], max_seqlen_q
    reads = "dense" if sequences is None else "varlen" if seqused_k is None else "varlen_used"
    launcher, padded_head_dim, fields, tma_inputs = _plan(
        q.get_device(), dtype, head_dim, mask, batch * heads, seqlen_q, reads, mods.score_mod,
        mods.dropout)

    out, lse = empty_outputs(q, heads_first)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:  # no key at all: every row sees nothing (but its sink)
        out.zero_()
        if mods.sinks is None:
            lse.fill_(-math.inf)
        else:
            lse.copy_(mods.sinks.view(1, -1, 1).expand(lse.shape))
        return out, lse

    inputs = q, k, v
    if padded_head_dim is not None:
        q, k, v = host.padded((q, k, v), padded_head_dim)
        o = q.new_empty(q.shape)  # (1, total_q, ...) for a variable-length batch
    else:  # out is freshly allocated, so aligned; the inputs may be any views
        q, k, v = host.aligned(q, k, v, tma=tma_inputs)
        o = out

    args = run(launcher, q, k, v, o, lse, scale, band, fields, sequences, mods=mods)
    if o is not out:
        out.copy_(o[..., :head_dim])
    elif key is not None and all(map(operator.is_, (q, k, v), inputs)):  # nothing copied
        _keep(key, launcher, args)
    return out, lse


# A call's launch per signature, its params filled once: what forward() decides from shapes,
# strides, dtypes and numbers alone (a variable-length batch's sequence count and longest
# lengths among them, never its device values), so that a call repeated at one shape (each layer
# of an eager decode loop, a training step) allocates its outputs and launches.
MAX_KEPT = 1024
_kept: dict = {}
# The params members each kept launch takes per call, in this order: the tensors, a
# variable-length batch's sequence tensors (seqused_k where given), tile_counter where its
# kernel claims tiles.
_TENSORS = ("q", "k", "v", "o", "softmax_lse")
_SEQUENCES = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k")
_INDEX = {name: params.FwdArgs._fields.index(name)
          for name in (*_TENSORS, *_SEQUENCES, "tile_counter")}
_ADDRESS_INDICES = tuple(params.FwdArgs._fields.index(name)
                         for ctype, name in params.members(params.FWD_FIELDS)
                         if ctype.endswith("*"))


_kept_holders: list = []  # callers' caches of kept launches (kept_launch's)


class _Kept(NamedTuple):
    launch: object  # the binding's PreparedFwd, taking the patched addresses and the stream
    counter: bool   # with a tile counter per call


def _key(q, k, v, scale: float, mask: str, band: Band, heads_first: bool, mods: Modifiers,
         varlen: tuple = ()):
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.get_device(), scale,
           mask, band, heads_first, mods.softcap)
    if varlen:  # the sequences' count, the longest lengths, whether seqused_k is given
        cu_seqlens_q, _, max_seqlen_q, max_seqlen_k = varlen[:4]
        key += (cu_seqlens_q.shape[0], max_seqlen_q, max_seqlen_k, len(sequence_tensors(varlen)))
    return key


def sequence_tensors(varlen: tuple) -> tuple:
    """A variable-length batch's tensors whose addresses a kept launch takes (_SEQUENCES')."""
    if not varlen:
        return ()
    return varlen[:2] if len(varlen) < 5 or varlen[4] is None else (*varlen[:2], varlen[4])


def kept_launch(q, k, v, scale: float, mask: str, band: Band, heads_first: bool,
                mods: Modifiers, varlen: tuple = ()):
    """The launch forward() keeps for a call with these arguments (varlen: cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k[, seqused_k or None]), for run_kept on any call of
    the same signature; None where it keeps none."""
    if not without_tensors(mods):  # _key leaves out what such modifiers hold
        return None
    return _kept.get(_key(q, k, v, scale, mask, band, heads_first, mods, varlen))


def holds_launches(forget) -> None:
    """forget(): drops a caller's kept launches (kept_launch's) when clear_plans forgets these."""
    _kept_holders.append(forget)


def without_tensors(mods: Modifiers) -> bool:
    """Whether the call's modifiers hold no tensor (a kept launch takes only the call's own
    tensors' addresses; backward.py keeps its launches on the same terms)."""
    return mods is PLAIN or (mods.alibi_slopes is None and mods.attn_bias is None
                             and mods.variant is None and mods.dropout_p == 0.0
                             and mods.sinks is None)


def _keep(key: tuple, launcher: loader.Launcher, args) -> None:
    """Keeps the launch of a call that ran on its own tensors, for the next of its signature;
    none where a params address is not among the patched ones (it would be this call's)."""
    counter = args.tile_counter != 0
    names = (*_TENSORS, *_SEQUENCES[:0 if args.cu_seqlens_q == 0 else 2 + (args.seqused_k != 0)],
             *(("tile_counter",) if counter else ()))
    patched = [_INDEX[name] for name in names]
    if any(args[i] for i in _ADDRESS_INDICES if i not in patched):
        return
    if len(_kept) >= MAX_KEPT:
        _kept.clear()
    _kept[key] = _Kept(loader.binding().prepare_fwd(
        launcher.address, launcher.error_string_address, patched, *args), counter)


def run_kept(kept: _Kept, q, k, v, heads_first: bool, sequences: tuple = ()):
    """out and lse of a call whose signature has a kept launch; None, launching nothing, where an
    address is not a multiple of 16 bytes (forward() then copies the tensor). sequences: a
    variable-length batch's (cu_seqlens_q, cu_seqlens_k[, seqused_k]) as sequence_tensors gives
    them; its q, k, v may be the packed (total, heads, dim) tensors, out then like q and lse
    (heads, total_q)."""
    addresses = [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    if (addresses[0] | addresses[1] | addresses[2]) % 16:
        return None
    if q.dim() == 3:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)
    else:
        out, lse = empty_outputs(q, heads_first)
    addresses += (out.data_ptr(), lse.data_ptr(), *(t.data_ptr() for t in sequences))
    if kept.counter:  # queued before it is freed: the caching allocator reuses it in stream order
        counter = torch.empty(1, dtype=torch.int32, device=q.device)
        addresses.append(counter.data_ptr())
    host.call_on_device(kept.launch, q.get_device(), addresses)
    return out, lse


def replay_parts(kept: _Kept, sequences: int, q_dims: int) -> tuple:
    """What flashgen/replay.py keeps of a kept launch to launch it from C++ as run_kept does
    for q of q_dims dims (4, or 3 for a variable-length batch's packed q) and `sequences`
    sequence tensors: ((the launch,), roles (out, lse, tile counter or -1, count of sources),
    lse's sizes as q's dims, the input sources (q, k, v, then the sequences')), for calls
    whose out is laid out like q (not heads first)."""
    launcher, error_string, params_bytes, offsets = kept.launch.parts()
    count = len(offsets)  # run_kept's addresses: q, k, v, out, lse, sequences, counter
    patches = [value for source, byte in enumerate(offsets) for value in (byte, source, 0)]
    roles = (3, 4, count - 1 if kept.counter else -1, count)
    lse_dims = (1, 0) if q_dims == 3 else (0, 2, 1)
    return (((launcher, error_string, params_bytes, patches),), roles, lse_dims,
            (0, 1, 2, *range(5, 5 + sequences)))


def empty_outputs(q: torch.Tensor, heads_first: bool):
    """The forward's uninitialised out and lse for q; the fake (meta) implementation of the
    flashgen::fwd op calls this too, so both always agree on shapes and strides."""
    batch, seqlen_q, heads, _ = q.shape
    # Sizes as separate ints: 0.8 us faster per call than a tuple (torch 2.13, CPU).
    return (host.empty_output(q, heads_first),
            q.new_empty(batch, heads, seqlen_q, dtype=torch.float32))


def run(launcher: loader.Launcher, q, k, v, o, lse, scale: float, band: Band, fields: dict,
        sequences: tuple | None = None, batch: int | None = None,
        seqlen_k: int | None = None, mods: Modifiers = PLAIN):
    """Runs one compiled forward kernel on aligned (batch, seq, heads, dim) views, on the
    tensors' device and its current stream; fields: its family's own FwdParams fields (a KV
    cache's among them). sequences: a variable-length batch's (cu_seqlens_q and cu_seqlens_k
    addresses, batch, max_seqlen_q, max_seqlen_k, seqused_k's address or 0), in place of the
    packed views' sizes. batch,
    seqlen_k: where k and v are a KV cache, the sequences and each one's capacity (k's own
    extents are the cache's rows or pages). Returns the launch's FwdArgs."""
    q_view_batch, seqlen_q, heads, _ = q.shape
    kv_view_batch, kv_view_rows, heads_kv, _ = k.shape
    batch = q_view_batch if batch is None else batch
    seqlen_k = kv_view_rows if seqlen_k is None else seqlen_k
    q_view_rows = seqlen_q
    cu_seqlens_q = cu_seqlens_k = seqused_k = 0
    if sequences is not None:
        cu_seqlens_q, cu_seqlens_k, batch, seqlen_q, seqlen_k, seqused_k = sequences
    spec = launcher.spec
    # The launcher zeroes it (when its grid claims tiles); freed after the launch is queued, the
    # caching allocator reuses it in stream order.
    counter = (torch.empty(1, dtype=torch.int32, device=q.device)
               if spec.family_record.tile_counter and spec.mask_kind.hides_keys else None)
    args = params.fwd_args(q=q, k=k, v=v, o=o, softmax_lse=lse.data_ptr(), batch=batch,
                           heads=heads, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                           **mods.fields(scale), **band.fields(),
                           cu_seqlens_q=cu_seqlens_q,
                           cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                           tile_counter=0 if counter is None else counter.data_ptr(),
                           q_view_batch=q_view_batch, q_view_rows=q_view_rows,
                           kv_view_batch=kv_view_batch, kv_view_rows=kv_view_rows, **fields)
    host.call_on_device(loader.binding().fwd, q.get_device(),
                        (launcher.address, launcher.error_string_address, *args))
    return args


def kernel_for(device: torch.device, dtype: str, head_dim: int, mask: str, batch_heads: int,
               seqlen_q: int, reads: str = "dense", score_mod: str = "none",
               dropout: bool = False) -> KernelSpec:
    """The forward kernel a call of this shape runs (the bench reports its tile)."""
    return _plan(device.index, dtype, head_dim, mask, batch_heads, seqlen_q, reads,
                 score_mod, dropout)[0].spec


def launcher_for(q, dtype: str, mask: str, score_mod: str, varlen: tuple = ()) -> loader.Launcher:
    """The launcher of the forward that a call on q (batch, seq, heads, dim) runs; varlen: a
    variable-length batch's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    batch, seqlen_q, heads, head_dim = q.shape
    if varlen:
        batch, seqlen_q = varlen[0].shape[0] - 1, varlen[2]
    return _plan(q.get_device(), dtype, head_dim, mask, batch * heads, seqlen_q,
                 "varlen" if varlen else "dense", score_mod)[0]


def clear_plans() -> None:
    """Forget every shape's plan and candidates (after a family's decisions or the environment
    changed, e.g. a pinned tile or $FLASHGEN_FAMILY)."""
    _plan.cache_clear()
    _candidates.cache_clear()
    _kept.clear()
    for forget in _kept_holders:
        forget()


# What a call's k and v are, and which families' forwards read them (codegen/family.py). A run
# whose keys past seqused_k may hold anything (NaN: P = 0 times NaN is NaN) needs loads that stop
# at its last used key: a TMA family's load whole key blocks.
_READERS = {"dense": lambda family: True,
            "varlen": lambda family: family.varlen_forward,
            "varlen_used": lambda family: family.varlen_forward and not family.tma_inputs,
            "cache": lambda family: family.cache_forward}


def plan(device_index: int, dtype: str, head_dim: int, mask: str, batch_heads: int,
         seqlen_q: int, reads: str = "dense", score_mod: str = "none"):
    """_plan, or None where no configured family's forward reads `reads` at this head dim
    unpadded (a KV cache is not padded: chunked prefill then runs on the decode kind)."""
    try:
        launcher, padded_head_dim, fields, _ = _plan(device_index, dtype, head_dim, mask,
                                                     batch_heads, seqlen_q, reads, score_mod)
    except NotImplementedError:
        return None
    return None if padded_head_dim is not None else (launcher, fields)


@functools.lru_cache(maxsize=4096)
def _plan(device_index: int, dtype: str, head_dim: int, mask: str, batch_heads: int,
          seqlen_q: int, reads: str = "dense", score_mod: str = "none",
          dropout: bool = False) -> tuple[loader.Launcher, int | None, dict, bool]:
    """The launcher for a call of this shape whose k and v are `reads` (_READERS), the head dim
    to zero-pad to (None: no padding), its family's FwdParams fields and whether its kernels load
    the inputs by TMA (host.aligned). Cached: the first call of a shape decides, later ones pay
    one lookup."""
    choices = _candidates(device_index, dtype, head_dim, mask, score_mod, dropout)
    if reads != "dense":
        choices = tuple(c for c in choices if _READERS[reads](c.spec.family_record))
        if not choices:
            what = ("seqused_k (a family whose loads stop at each run's last used key, the mma "
                    "family)" if reads == "varlen_used" else f"{reads} inputs")
            raise NotImplementedError(f"flashgen: no configured forward of head dim {head_dim} "
                                      f"reads {what}; check $FLASHGEN_FAMILY and the config")
    family = choices[0].spec.family
    specs = tuple(c.spec for c in choices if c.spec.family == family)
    spec, fields = families.runtime(family).forward_plan(specs, batch_heads, seqlen_q,
                                                         device_index)
    return (loader.launcher(spec), choices[0].padded_head_dim, fields,
            spec.family_record.tma_inputs)


@functools.cache
def _candidates(device_index: int, dtype: str, head_dim: int, mask: str, score_mod: str = "none",
                dropout: bool = False):
    props = torch.cuda.get_device_properties(device_index)
    return registry.candidates(arch_for_capability(props.major, props.minor), "fwd", dtype,
                               head_dim, mask, score_mod, dropout=dropout)
