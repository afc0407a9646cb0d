"""FlashAttention-2's packed functions: q, k and v (or k and v) stacked in one tensor, as a fused
QKV projection writes them. Each takes views into the packed tensor (no copy) and calls the
unpacked function; gradients reach the packed tensor through the views."""

from __future__ import annotations

from flashgen import attention


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func over qkv (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _unpack("qkv", qkv, 3, dim=2)
    return attention.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
                                     softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unpack("kv", kv, 2, dim=2)
    return attention.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
                                     softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func over qkv (total, 3, nheads, headdim), the same cu_seqlens and
    max_seqlen for queries and keys."""
    q, k, v = _unpack("qkv", qkv, 3, dim=1)
    return attention.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen,
                                            max_seqlen, dropout_p, softmax_scale, causal,
                                            window_size, softcap, alibi_slopes, deterministic,
                                            return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    k, v = _unpack("kv", kv, 2, dim=1)
    return attention.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, dropout_p, softmax_scale, causal,
                                            window_size, softcap, alibi_slopes, deterministic,
                                            return_attn_probs)


def _unpack(name: str, packed, parts: int, dim: int):
    shape = getattr(packed, "shape", None)
    rank = dim + 3
    if shape is None or len(shape) != rank or shape[dim] != parts:
        layout = ("(batch, seqlen, " if dim == 2 else "(total, ") + f"{parts}, nheads, headdim)"
        raise ValueError(f"flashgen: {name} must be {layout}, got "
                         f"{None if shape is None else tuple(shape)}")
    return packed.unbind(dim)
