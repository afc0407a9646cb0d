"""The backward pass on (batch, seq, heads, dim) views: gradients of q, k and v from the forward's
output and log-sum-exp (FlashAttention-2: nothing of size seqlen_q x seqlen_k is stored), from one
compiled kernel of the best configured family."""

from __future__ import annotations

import functools

import torch

from codegen.arch import arch_for_capability
from flashgen import families, host, loader, registry
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
    lse = lse.contiguous()
    dsinks = run(launcher, *inputs, lse, *work, scale, band, deterministic, varlen, mods,
                 bias_grad)
    if work is not grads:
        for grad, padded in zip(grads, work):
            grad.copy_(padded[..., :head_dim])
    return (*grads, bias_grad, dsinks)


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
    spec = launcher.spec
    runtime = families.runtime(spec.family)
    args, scratch = runtime.backward_args(
        spec, q, k, v, out, dout, lse, dq, dk, dv, scale, band, deterministic, varlen, mods,
        bias_grad)
    host.call_on_device(loader.binding().bwd, q.get_device(),
                        (launcher.address, launcher.error_string_address, *args))
    if mods.sinks is None:
        return None  # the scratch is queued: the caching allocator reuses it in stream order
    return sinks_gradient(runtime.softmax_d(spec, scratch, q, varlen).view(lse.shape), lse,
                          mods.sinks)


def kernel_for(device: torch.device, dtype: str, head_dim: int, mask: str,
               varlen: bool = False, score_mod: str = "none", dropout: bool = False,
               attn_bias_grad: bool = False):
    """The backward kernel a call runs (the bench reports its family and tile)."""
    return _choose(device.index, dtype, head_dim, mask, varlen, score_mod, dropout,
                   attn_bias_grad)[0].spec


def clear_plans() -> None:
    """Forget every call's choice (after $FLASHGEN_FAMILY changed)."""
    _choose.cache_clear()


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
