"""The backward pass on (batch, seq, heads, dim) views: gradients of q, k and v from the forward's
output and log-sum-exp (FlashAttention-2: nothing of size seqlen_q x seqlen_k is stored), from one
compiled kernel of the best configured family."""

from __future__ import annotations

import functools
import torch

from codegen import params
from codegen.arch import arch_for_capability
from flashgen import families, forward, host, loader, registry, replay
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers


def backward(dout, q, k, v, out, lse, dtype: str, scale: float, mask: str, band: Band,
             deterministic: bool, heads_first: bool, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=0, max_seqlen_k=0, *, mods: Modifiers = PLAIN,
             attn_bias_grad: bool = False):
    """dq, dk, dv with the shapes of q, k, v; with attn_bias_grad (mods.attn_bias's gradient
    wanted, equal lengths) that gradient, (batch, heads, seqlen_q, seqlen_k) fp32, else None; and
    with mods.sinks the sinks' gradient (sinks_gradient), else None.

    dout, q, k, v, out: (batch, seq, heads, dim) views of one fp16/bf16 dtype (`dtype` is its short
    name), already validated by the forward; lse: (batch, heads, seqlen_q) fp32 from the forward.
    mask, band and mods as in the forward. deterministic=True gives bit-identical gradients
    across runs. The gradients are allocated as the forward's output is (host.empty_output):
    heads_first=True lays them out in memory as (batch, heads, seq, dim), SDPA's layout, with
    (batch, seq, heads, dim) shapes. A variable-length batch as in forward.forward.
    """
    key = _signature(dout, q, k, v, out, lse, scale, mask, band, deterministic, heads_first,
                     mods, cu_seqlens_q is not None, attn_bias_grad)
    if key is not None:
        kept = _kept.get(key)
        if kept is not None:
            ran = _run_kept(kept, (q, k, v, out, dout, lse), heads_first)
            if ran is not None:
                return ran
    varlen = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k)
    grads = tuple(host.empty_output(t, heads_first) for t in (q, k, v))
    bias_grad = None
    if attn_bias_grad:
        batch, seqlen_q, heads, _ = q.shape
        bias_grad = torch.empty(batch, heads, seqlen_q, k.shape[1], dtype=torch.float32,
                                device=q.device)
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: nothing flows back
        return (*(g.zero_() for g in grads), None if bias_grad is None else bias_grad.zero_(),
                None if mods.sinks is None else torch.zeros_like(mods.sinks))
    head_dim = q.shape[-1]
    launcher, padded_head_dim = _choose(q.get_device(), dtype, head_dim, mask, bool(varlen),
                                        mods.score_mod, mods.dropout, attn_bias_grad)
    if padded_head_dim is not None:  # zero-padded: exact, the padded columns are dropped
        inputs = host.padded((q, k, v, out, dout), padded_head_dim)
        work = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in inputs[:3])
    else:
        inputs = host.aligned(q, k, v, out, dout,
                              tma=launcher.spec.family_record.tma_inputs)
        work = grads
    given_lse, lse = lse, lse.contiguous()
    args, scratch = _args(launcher, *inputs, lse, *work, scale, band, deterministic, varlen,
                          mods, bias_grad)
    _launch(launcher, args, q.get_device())
    dsinks = _sinks_gradient(launcher, scratch, q, lse, varlen, mods)
    if work is not grads:
        for grad, padded in zip(grads, work):
            grad.copy_(padded[..., :head_dim])
    elif key is not None:
        _keep(key, launcher, args, (q, k, v, out, dout, given_lse, *grads), scratch)
    return (*grads, bias_grad, dsinks)


# A dense call's launch per signature, its params filled once (as forward's kept launches): a
# backward repeated at one shape allocates its gradients and scratch and launches. Each address
# member's source is found by value at the first call: one of its tensors, or an offset into its
# scratch; a call whose addresses are not all its own tensors' (a copy was made) keeps none.
MAX_KEPT = 1024
_kept: dict = {}
_ADDRESS_INDICES = tuple(params.BwdArgs._fields.index(name)
                         for ctype, name in params.members(params.BWD_FIELDS)
                         if ctype.endswith("*"))


def _signature(dout, q, k, v, out, lse, scale: float, mask: str, band: Band,
               deterministic: bool, heads_first: bool, mods: Modifiers, varlen: bool,
               attn_bias_grad: bool):
    """A dense call's key among the kept launches; None for a call that keeps none."""
    if varlen or attn_bias_grad or not forward.without_tensors(mods):
        return None
    return (dout.shape, dout.stride(), q.shape, q.stride(), k.shape, k.stride(), v.stride(),
            out.stride(), lse.shape, lse.stride(), q.dtype, q.get_device(), scale, mask, band,
            deterministic, heads_first, mods.softcap)


class _Kept:
    __slots__ = ("launch", "sources", "scratch", "offered")

    def __init__(self, launch, sources: tuple, scratch: int):
        self.launch = launch    # the binding's PreparedBwd, taking the sources' addresses and
                                # the stream
        self.sources = sources  # per patched member: (its tensor's index, -1: the scratch;
                                # byte offset)
        self.scratch = scratch  # fp32 elements of the scratch
        self.offered = -1       # replay.generation when offered to the compiled replay


def kept_launch(dout, q, k, v, out, lse, scale: float, mask: str, band: Band,
                deterministic: bool, heads_first: bool, mods: Modifiers, varlen: bool,
                attn_bias_grad: bool) -> _Kept | None:
    """The launch kept for backward()'s calls of these arguments' signature, if any."""
    key = _signature(dout, q, k, v, out, lse, scale, mask, band, deterministic, heads_first,
                     mods, varlen, attn_bias_grad)
    return None if key is None else _kept.get(key)


# The compiled replay's sources of a backward (replay_parts): _keep's tensors (q, k, v, out,
# dout, lse, dq, dk, dv), then the scratch.
REPLAY_SCRATCH = 9
# Its roles: the sources dq, dk, dv and the scratch, then the count of sources.
REPLAY_ROLES = (6, 7, 8, REPLAY_SCRATCH, 10)


def replay_parts(kept: _Kept) -> tuple:
    """What flashgen/replay.py keeps of a kept launch to launch it from C++ as _run_kept does:
    ((the launch,), roles (REPLAY_ROLES), the scratch's fp32 elements)."""
    launcher, error_string, params_bytes, offsets = kept.launch.parts()
    patches = [value for (source, offset), byte in zip(kept.sources, offsets)
               for value in ((byte, REPLAY_SCRATCH, offset) if source < 0 else (byte, source, 0))]
    return ((launcher, error_string, params_bytes, patches),), REPLAY_ROLES, kept.scratch


def _keep(key: tuple, launcher: loader.Launcher, args, tensors: tuple, scratch) -> None:
    """tensors: q, k, v, out, dout, lse, dq, dk, dv as the call passed and allocated them."""
    addresses = [t.data_ptr() for t in tensors]
    if len(set(addresses)) != len(addresses):  # k is v, say: which one a later call means is
        return                                 # not known
    start, end = scratch.data_ptr(), scratch.data_ptr() + 4 * scratch.numel()
    patched, sources = [], []
    for index in _ADDRESS_INDICES:
        address = args[index]
        if address == 0:
            continue
        if address in addresses:
            sources.append((addresses.index(address), 0))
        elif start <= address < end:
            sources.append((-1, address - start))
        else:
            return
        patched.append(index)
    if len(_kept) >= MAX_KEPT:
        _kept.clear()
    _kept[key] = _Kept(loader.binding().prepare_bwd(
        launcher.address, launcher.error_string_address, patched, *args), tuple(sources),
        scratch.numel())


def _run_kept(kept: _Kept, inputs: tuple, heads_first: bool):
    """dq, dk, dv (and no bias or sinks gradient) of a call whose signature has a kept launch;
    None, launching nothing, where an input's address is not a multiple of 16 bytes."""
    q, k, v, out, dout, _ = inputs
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | dout.data_ptr()) % 16:
        return None
    grads = tuple(host.empty_output(t, heads_first) for t in (q, k, v))
    # The launcher zeroes what must start at 0; queued before it is freed, the caching
    # allocator reuses it in stream order.
    scratch = torch.empty(kept.scratch, dtype=torch.float32, device=q.device)
    addresses = [t.data_ptr() for t in (*inputs, *grads)]
    base = scratch.data_ptr()
    host.call_on_device(kept.launch, q.get_device(),
                        [base + offset if source < 0 else addresses[source]
                         for source, offset in kept.sources])
    return (*grads, None, None)


def sinks_gradient(softmax_d, lse, sinks):
    """The gradient of the sinks (fp32 (heads,)) that joined the forward's softmax: a sink takes
    probability P = exp(sink - lse) of each row and adds no value, so its gradient is minus the
    sum over its head's rows of P times D = rowsum(dout * out), out and lse being the forward's
    (with the sink). softmax_d: D as the kernel computed it, laid out as lse, (batch, heads,
    seq)."""
    return -(torch.exp(sinks.view(1, -1, 1) - lse) * softmax_d).sum((0, 2))


def run(launcher: loader.Launcher, q, k, v, out, dout, lse, dq, dk, dv, scale: float,
        band: Band, deterministic: bool, varlen: tuple = (), mods: Modifiers = PLAIN,
        bias_grad=None):
    """Runs one compiled backward kernel on aligned (batch, seq, heads, dim) views; its family
    decides its grids and workspaces. varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) of a variable-length batch packed into (1, total, heads, dim) views.
    bias_grad: where the bias score modifier's gradient goes (a family with bias_gradient).
    Returns the sinks' gradient with mods.sinks (from D in the kernel's workspace: no second
    pass over dout and out), else None."""
    args, scratch = _args(launcher, q, k, v, out, dout, lse, dq, dk, dv, scale, band,
                          deterministic, varlen, mods, bias_grad)
    _launch(launcher, args, q.get_device())
    return _sinks_gradient(launcher, scratch, q, lse, varlen, mods)


def _args(launcher: loader.Launcher, q, k, v, out, dout, lse, dq, dk, dv, scale: float,
          band: Band, deterministic: bool, varlen: tuple, mods: Modifiers, bias_grad):
    """(BwdArgs, the scratch they point into), its family's."""
    return families.runtime(launcher.spec.family).backward_args(
        launcher.spec, q, k, v, out, dout, lse, dq, dk, dv, scale, band, deterministic, varlen,
        mods, bias_grad)


def _launch(launcher: loader.Launcher, args, device_index: int) -> None:
    host.call_on_device(loader.binding().bwd, device_index,
                        (launcher.address, launcher.error_string_address, *args))


def _sinks_gradient(launcher: loader.Launcher, scratch, q, lse, varlen: tuple, mods: Modifiers):
    if mods.sinks is None:
        return None  # the scratch is queued: the caching allocator reuses it in stream order
    runtime = families.runtime(launcher.spec.family)
    return sinks_gradient(runtime.softmax_d(launcher.spec, scratch, q, varlen).view(lse.shape),
                          lse, mods.sinks)


def kernel_for(device: torch.device, dtype: str, head_dim: int, mask: str,
               varlen: bool = False, score_mod: str = "none", dropout: bool = False,
               attn_bias_grad: bool = False):
    """The backward kernel a call runs (the bench reports its family and tile)."""
    return _choose(device.index, dtype, head_dim, mask, varlen, score_mod, dropout,
                   attn_bias_grad)[0].spec


def clear_plans() -> None:
    """Forget every call's choice and kept launch (after $FLASHGEN_FAMILY changed), and what
    the compiled replay kept of them."""
    _choose.cache_clear()
    _kept.clear()
    replay.forget()


@functools.cache
def _choose(device_index: int, dtype: str, head_dim: int, mask: str, varlen: bool = False,
            score_mod: str = "none", dropout: bool = False,
            attn_bias_grad: bool = False) -> tuple[loader.Launcher, int | None]:
    """The backward launcher for these calls and the head dim to zero-pad to (None: no padding):
    the best family's main tile (among those that take a variable-length batch, for one, and
    that write the bias's gradient, for attn_bias_grad), whatever the shape. Cached: the first
    call decides, later ones pay one lookup."""
    arch = arch_for_capability(*torch.cuda.get_device_capability(device_index))
    choices = registry.candidates(
        arch, "bwd", dtype, head_dim, mask, score_mod,
        accepts=lambda family: ((family.varlen_backward or not varlen)
                                and (family.bias_gradient or not attn_bias_grad)),
        dropout=dropout)
    if not choices:  # only where the family filter left none
        raise NotImplementedError(f"flashgen: no configured backward of head dim {head_dim} "
                                  f"takes a variable-length batch or writes an attn_mask's "
                                  f"gradient; configure the mma family's "
                                  f"[mma.<arch>.head_dim.N.backward]")
    return loader.launcher(choices[0].spec), choices[0].padded_head_dim
