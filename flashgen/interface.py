"""The public functions: FlashAttention-2's flash_attn_func and a drop-in for PyTorch's SDPA."""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from codegen import paths
from codegen.arch import arch_for_capability
from flashgen import dispatch, loader, registry, validate

_LOG2_E = math.log2(math.e)
_arch_of_device: dict[int, str] = {}
_choices: dict[tuple, tuple[loader.Launcher, int | None]] = {}
_warned_copy = False


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Exact attention, FlashAttention-2's interface.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), with
    nheads a multiple of nheads_kv (GQA/MQA). fp16 or bf16 CUDA tensors, any strides with the
    last dimension contiguous. The causal mask is aligned to the bottom-right corner of the
    score matrix. Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse, None), softmax_lse (batch, nheads, seqlen_q) in fp32 (natural log). A query
    row that sees no key gets output 0 and lse -inf. The forward is deterministic.
    """
    validate.check_unsupported(dropout_p=(dropout_p, 0.0), window_size=(tuple(window_size), (-1, -1)),
                               softcap=(softcap, 0.0), alibi_slopes=(alibi_slopes, None))
    dtype = validate.check_tensors(("q", "k", "v"), q, k, v)
    _check_shapes(("q", "k", "v"), q, k, v, "(batch, seqlen, nheads, headdim)")
    scale = validate.check_scale(softmax_scale, q.shape[-1])
    causal_offset = k.shape[1] - q.shape[1]  # bottom-right aligned
    out, lse = _apply(q, k, v, dtype, scale, bool(causal), causal_offset, heads_first=False)
    return (out, lse, None) if return_attn_probs else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on (batch, heads, seq, dim)
    (or (heads, seq, dim)) fp16/bf16 CUDA tensors. The causal mask is aligned top-left, as
    PyTorch's."""
    validate.check_unsupported(attn_mask=(attn_mask, None), dropout_p=(dropout_p, 0.0))
    unbatched = isinstance(query, torch.Tensor) and query.dim() == 3
    if unbatched:
        query, key, value = (t.unsqueeze(0) if isinstance(t, torch.Tensor) else t
                             for t in (query, key, value))
    dtype = validate.check_tensors(("query", "key", "value"), query, key, value)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # views (batch, seq, heads, dim)
    _check_shapes(("query", "key", "value"), q, k, v, "(batch, heads, seq, dim)")
    if q.shape[2] != k.shape[2] and not enable_gqa:
        raise ValueError(f"flashgen: query has {q.shape[2]} heads and key/value {k.shape[2]}; "
                         f"pass enable_gqa=True for grouped-query attention")
    softmax_scale = validate.check_scale(scale, q.shape[-1])
    out, _ = _apply(q, k, v, dtype, softmax_scale, bool(is_causal), 0, heads_first=True)
    out = out.transpose(1, 2)
    return out.squeeze(0) if unbatched else out


def _check_shapes(names, q, k, v, layout: str) -> None:
    b, _, h, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"flashgen: {names[1]} and {names[2]} must have the same shape "
                         f"{layout}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"flashgen: {names[0]} {tuple(q.shape)} and {names[1]} {tuple(k.shape)} "
                         f"must agree in batch and head dim; layout {layout}")
    hk = k.shape[2]
    if hk == 0 or h % hk:
        raise ValueError(f"flashgen: the number of query heads ({h}) must be a multiple of the "
                         f"number of key/value heads ({hk})")


def _apply(q, k, v, dtype, scale, causal, causal_offset, heads_first):
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _NoBackward.apply(q, k, v, dtype, scale, causal, causal_offset, heads_first)
    return _forward(q, k, v, dtype, scale, causal, causal_offset, heads_first)


class _NoBackward(torch.autograd.Function):
    """Keeps autograd honest until the backward kernels exist: a gradient request fails loudly
    instead of silently treating attention as a constant."""

    @staticmethod
    def forward(ctx, q, k, v, dtype, scale, causal, causal_offset, heads_first):
        return _forward(q, k, v, dtype, scale, causal, causal_offset, heads_first)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("flashgen: the backward pass is not implemented yet")


def _forward(q, k, v, dtype, scale, causal, causal_offset, heads_first):
    """q, k, v as (batch, seq, heads, dim) views. Returns out in that view and lse."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    device = q.device
    launcher, padded_head_dim = _choose(device, dtype, head_dim, causal)

    if heads_first:  # SDPA: the output is (batch, heads, seq, dim) in memory
        out = torch.empty((batch, heads, seqlen_q, head_dim), dtype=q.dtype,
                          device=device).transpose(1, 2)
    else:
        out = torch.empty((batch, seqlen_q, heads, head_dim), dtype=q.dtype, device=device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:  # no key at all: every row sees nothing
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse

    if padded_head_dim is not None:
        pad = (0, padded_head_dim - head_dim)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        o = torch.empty((batch, seqlen_q, heads, padded_head_dim), dtype=q.dtype, device=device)
    else:  # out is freshly allocated, so aligned; the inputs may be any views
        q, k, v = (t if validate.is_aligned(t) else _aligned_copy(t) for t in (q, k, v))
        o = out

    launch(launcher, q, k, v, o, lse, scale, causal_offset if causal else 0)
    if o is not out:
        out.copy_(o[..., :head_dim])
    return out, lse


def launch(launcher: loader.Launcher, q, k, v, o, lse, scale: float, causal_offset: int) -> None:
    """Runs one compiled kernel on validated (batch, seq, heads, dim) views, on the tensors'
    device and its current stream."""
    batch, seqlen_q, heads, _ = q.shape
    device = q.device
    args = (launcher.address, launcher.error_string_address, q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), q.stride()[:3], k.stride()[:3],
            v.stride()[:3], o.stride()[:3], batch, heads, k.shape[2], seqlen_q, k.shape[1], scale,
            scale * _LOG2_E, causal_offset, torch.cuda.current_stream(device).cuda_stream)
    if device.index == torch.cuda.current_device():
        loader.binding().fwd(*args)
    else:  # kernels launch on the current device: switch to the tensors' one
        with torch.cuda.device(device):
            loader.binding().fwd(*args)


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    global _warned_copy
    if not _warned_copy:
        print("flashgen: an input's address or strides are not multiples of 16 bytes; copying "
              "it (pass contiguous tensors to avoid the copy)", file=sys.stderr)
        _warned_copy = True
    return t.clone(memory_format=torch.contiguous_format)


def _choose(device: torch.device, dtype: str, head_dim: int, causal: bool):
    key = (device.index, dtype, head_dim, causal)
    found = _choices.get(key)
    if found is None:
        arch = _arch_of_device.get(device.index)
        if arch is None:
            arch = arch_for_capability(*torch.cuda.get_device_capability(device))
            _arch_of_device[device.index] = arch
        choice = dispatch.select(registry.configured_specs(), arch, dtype, head_dim, causal,
                                 paths.config_path())
        found = (loader.launcher(choice.spec), choice.spec.head_dim if choice.pad_head_dim else None)
        _choices[key] = found
    return found
