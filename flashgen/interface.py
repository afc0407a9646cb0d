"""The public functions: FlashAttention-2's flash_attn_func and a drop-in for PyTorch's SDPA."""

from __future__ import annotations

import torch

from flashgen import ops, validate


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Exact attention, FlashAttention-2's interface.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), with
    nheads a multiple of nheads_kv (GQA/MQA). fp16 or bf16 CUDA tensors (under
    torch.autocast("cuda"), others are cast to its dtype), any strides with the last dimension
    contiguous. The causal mask is aligned to the bottom-right corner of the score matrix. Returns
    out (batch, seqlen_q, nheads, headdim), or with return_attn_probs (out, softmax_lse, None),
    softmax_lse (batch, nheads, seqlen_q) in fp32 (natural log). A query row that sees no key gets
    output 0 and lse -inf. Differentiable in q, k and v; softmax_lse is not differentiable (it
    does not require grad). The forward is deterministic; deterministic=True makes the backward
    bit-reproducible too.
    """
    if dropout_p != 0.0 or softcap != 0.0 or alibi_slopes is not None or window_size != (-1, -1):
        validate.check_unsupported(dropout_p=(dropout_p, 0.0),
                                   window_size=(tuple(window_size), (-1, -1)),
                                   softcap=(softcap, 0.0), alibi_slopes=(alibi_slopes, None))
    q, k, v = _autocast(q, k, v)
    if not validate.passes_tensor_checks(q, k, v, heads_axis=2):
        validate.check_tensors(("q", "k", "v"), q, k, v)
        validate.check_shapes(("q", "k", "v"), q, k, v, "(batch, seqlen, nheads, headdim)")
    _, seqlen_q, _, head_dim = q.shape
    scale = validate.check_scale(softmax_scale, head_dim)
    mask, mask_offset = ("causal", k.shape[1] - seqlen_q) if causal else ("none", 0)
    out, lse = ops.attention(q, k, v, scale, mask, mask_offset, bool(deterministic),
                             heads_first=False)  # causal aligned bottom-right
    return (out, lse, None) if return_attn_probs else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on (batch, heads, seq, dim)
    (or (heads, seq, dim)) fp16/bf16 CUDA tensors, cast to the autocast dtype under
    torch.autocast("cuda") as PyTorch's is. The causal mask is aligned top-left, as PyTorch's.
    Differentiable; the backward is bit-reproducible under
    torch.use_deterministic_algorithms(True)."""
    if attn_mask is not None or dropout_p != 0.0:
        validate.check_unsupported(attn_mask=(attn_mask, None), dropout_p=(dropout_p, 0.0))
    unbatched = isinstance(query, torch.Tensor) and query.dim() == 3
    if unbatched:
        query, key, value = (t.unsqueeze(0) if isinstance(t, torch.Tensor) else t
                             for t in (query, key, value))
    query, key, value = _autocast(query, key, value)
    if not validate.passes_tensor_checks(query, key, value, heads_axis=1):
        _check_sdpa_tensors(query, key, value)
    _, heads, _, head_dim = query.shape
    heads_kv = key.shape[1]
    if heads != heads_kv and not enable_gqa:
        raise ValueError(f"flashgen: query has {heads} heads and key/value {heads_kv}; "
                         f"pass enable_gqa=True for grouped-query attention")
    softmax_scale = validate.check_scale(scale, head_dim)
    # views (batch, seq, heads, dim); spelled out, 0.5 us faster than a generator
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    deterministic = torch.are_deterministic_algorithms_enabled()
    out, _ = ops.attention(q, k, v, softmax_scale, "causal" if is_causal else "none", 0,
                           deterministic, heads_first=True)  # causal aligned top-left
    out = out.transpose(1, 2)
    return out.squeeze(0) if unbatched else out


def _autocast(q, k, v):
    """Under torch.autocast("cuda"), what PyTorch does to SDPA's inputs (it is on autocast's
    lower-precision list): floating-point CUDA tensors other than fp64 go to the autocast dtype.
    In the wrapper, not in an autocast kernel of the op: validation, before the op, rejects fp32.
    torch.compile traces this code, so compiled and eager calls cast alike."""
    if not torch.is_autocast_enabled("cuda"):
        return q, k, v
    dtype = torch.get_autocast_dtype("cuda")
    return tuple(t.to(dtype) if _autocast_eligible(t) else t for t in (q, k, v))


def _autocast_eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point()
            and t.dtype != torch.float64)


def _check_sdpa_tensors(query, key, value) -> None:
    """The detailed checks, shapes on the (batch, seq, heads, dim) views as the kernel sees them."""
    validate.check_tensors(("query", "key", "value"), query, key, value)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    validate.check_shapes(("query", "key", "value"), q, k, v, "(batch, heads, seq, dim)")
