"""flash_attn.flash_attn_interface: FlashAttention-2's functions, with its return values.

They call flashgen's functions of the same names. Where flashgen keeps a different semantic on
purpose, this module gives FlashAttention-2's: softmax_lse of a query row that sees no key is
+inf here (FA2's value), -inf in flashgen (the log of an empty sum).

Bad input raises exceptions that are both FA2's RuntimeError and flashgen's ValueError (or
TypeError). The private functions that ring attention and FA2's own tests call (_flash_attn_forward,
_flash_attn_backward and their varlen forms) and the raw entry points behind them
(flash_attn_gpu) keep FA2's signatures and returns, with two differences: S_dmask is always None
(flashgen does not return the dropout pattern), and rng_state is flashgen's dropout key, a (1,)
int64 tensor (empty without dropout) that the backward takes back as FA2's does.
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

import flashgen
from flashgen import attention, ops

# FA2 reads this to run its Triton kernels on AMD GPUs; flashgen has none.
USE_TRITON_ROCM = os.getenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "FALSE") == "TRUE"


class FlashAttentionValueError(RuntimeError, ValueError):
    """Bad input, raised as FA2 raises it (a RuntimeError from its checks) and as flashgen does."""


class FlashAttentionTypeError(RuntimeError, TypeError):
    """A wrong type, raised as FA2 raises it and as flashgen does."""


def _fa2_errors(function):
    """FA2's checks raise RuntimeError; flashgen's raise ValueError and TypeError. The functions
    here raise exceptions that are both."""
    @functools.wraps(function)
    def checked(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError) as error:
            if isinstance(error, RuntimeError):
                raise
            kind = FlashAttentionValueError if isinstance(error, ValueError) else \
                FlashAttentionTypeError
            raise kind(str(error)) from error
    # Ring attention (ring-flash-attn's get_default_args) builds its calls from
    # inspect.getfullargspec, which ignores __wrapped__ but reads __signature__.
    checked.__signature__ = inspect.signature(function)
    return checked


def _with_fa2_lse(result, returns_lse: bool):
    if not returns_lse:
        return result
    out, lse, *rest = result
    return (out, torch.where(lse == float("-inf"), float("inf"), lse), *rest)


@_fa2_errors
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    return _with_fa2_lse(flashgen.flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs), return_attn_probs)


@_fa2_errors
def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    return _with_fa2_lse(flashgen.flash_attn_qkvpacked_func(
        qkv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs), return_attn_probs)


@_fa2_errors
def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    return _with_fa2_lse(flashgen.flash_attn_kvpacked_func(
        q, kv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs), return_attn_probs)


@_fa2_errors
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    return _with_fa2_lse(flashgen.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, block_table), return_attn_probs)


@_fa2_errors
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    return _with_fa2_lse(flashgen.flash_attn_varlen_qkvpacked_func(
        qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs), return_attn_probs)


@_fa2_errors
def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    return _with_fa2_lse(flashgen.flash_attn_varlen_kvpacked_func(
        q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs),
        return_attn_probs)


@_fa2_errors
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    return _with_fa2_lse(flashgen.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse), return_softmax_lse)


def _rng_state(mods, q):
    return mods.dropout_seed if mods.dropout else q.new_empty(0, dtype=torch.int64)


def _seed(dropout_p, rng_state):
    """The forward's dropout key for a backward (None: no dropout, or a fresh draw)."""
    return rng_state if dropout_p > 0 and rng_state is not None and rng_state.numel() else None


@_fa2_errors
def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                        window_size_right, softcap, alibi_slopes, return_softmax):
    """(out, softmax_lse, S_dmask, rng_state) without autograd."""
    with torch.no_grad():
        q, k, v, scale, mask, band, mods = attention.dense_arguments(
            q, k, v, dropout_p, softmax_scale, causal, (window_size_left, window_size_right),
            softcap, alibi_slopes)
        out, lse = ops.attention(q, k, v, scale, mask, band, False, heads_first=False, mods=mods)
    return (out, *_with_fa2_lse((None, lse), True)[1:], None, _rng_state(mods, q))


@_fa2_errors
def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size_left=-1,
                               window_size_right=-1, softcap=0.0, alibi_slopes=None,
                               return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False, num_splits=0):
    """(out, softmax_lse, S_dmask, rng_state) without autograd; softmax_lse (nheads, total_q)."""
    if num_splits > 1:
        raise RuntimeError("flashgen: num_splits > 1 is not supported by the varlen forward "
                           "(flash_attn_with_kvcache splits the keys)")
    if leftpad_k is not None:
        raise NotImplementedError("flashgen: the varlen forward takes no leftpad_k; "
                                  "flash_attn_with_kvcache takes cache_leftpad")
    if block_table is not None or seqused_k is not None:
        with torch.no_grad():
            out, lse = flashgen.flash_attn_varlen_func(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, causal, (window_size_left, window_size_right), softcap,
                alibi_slopes, block_table=block_table, seqused_k=seqused_k,
                num_splits=num_splits, return_softmax_lse=True)
        return out, _with_fa2_lse((None, lse), True)[1], None, q.new_empty(0, dtype=torch.int64)
    with torch.no_grad():
        q4, k4, v4, scale, mask, band, varlen, mods = attention.varlen_arguments(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, (window_size_left, window_size_right), softcap, alibi_slopes)
        out, lse = ops.attention(q4, k4, v4, scale, mask, band, False, heads_first=False,
                                 varlen=varlen, mods=mods)
    lse = _with_fa2_lse((None, lse.squeeze(0)), True)[1]
    return out.squeeze(0), lse, None, _rng_state(mods, q)


def _into(buffers, grads):
    """FA2 writes the gradients into the caller's dq, dk, dv where given; returns them."""
    return tuple(grad if buffer is None else buffer.copy_(grad)
                 for buffer, grad in zip(buffers, grads))


def _softmax_d(dout, out, rows_axis):
    """rowsum(dout * out), FA2's softmax_d: (batch, nheads, seqlen_q), or (nheads, total_q)."""
    return (dout.float() * out.float()).sum(-1).movedim(rows_axis, -1)


@_fa2_errors
def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         deterministic, rng_state=None):
    """Writes the gradients into dq, dk and dv (each may be None) and returns softmax_d."""
    with torch.no_grad():
        q_, k_, v_, scale, mask, band, mods = attention.dense_arguments(
            q, k, v, dropout_p, softmax_scale, causal, (window_size_left, window_size_right),
            softcap, alibi_slopes, dropout_seed=_seed(dropout_p, rng_state))
        grads = ops.attention_backward(dout, q_, k_, v_, out, softmax_lse.float(), scale, mask,
                                       band, bool(deterministic), False, mods=mods)
        _into((dq, dk, dv), grads)
        return _softmax_d(dout, out, 1)


@_fa2_errors
def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False):
    """The varlen backward: gradients into dq, dk and dv, returns softmax_d (nheads, total_q)."""
    with torch.no_grad():
        q4, k4, v4, scale, mask, band, varlen, mods = attention.varlen_arguments(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, (window_size_left, window_size_right), softcap, alibi_slopes,
            dropout_seed=_seed(dropout_p, rng_state))
        grads = ops.attention_backward(dout.unsqueeze(0), q4, k4, v4, out.unsqueeze(0),
                                       softmax_lse.float().unsqueeze(0), scale, mask, band,
                                       bool(deterministic), False, varlen, mods=mods)
        _into((dq, dk, dv), (g.squeeze(0) for g in grads))
        return _softmax_d(dout, out, 0)


def _no_generator(generator):
    if generator is not None:
        raise RuntimeError("flashgen: the `generator` argument is no longer supported (as in "
                           "FlashAttention-2 2.8); pass None and seed with torch.manual_seed")


class flash_attn_gpu:  # noqa: N801 - FA2's name for its extension module
    """FA2's raw entry points (its C++ extension's positional signatures), over the functions
    above: out, when given, receives the output."""

    @staticmethod
    @_fa2_errors
    def fwd(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left,
            window_size_right, softcap, return_softmax, gen=None):
        _no_generator(gen)
        result = _flash_attn_forward(q, k, v, p_dropout, softmax_scale, is_causal,
                                     window_size_left, window_size_right, softcap, alibi_slopes,
                                     return_softmax)
        return (result[0] if out is None else out.copy_(result[0]), *result[1:])

    @staticmethod
    @_fa2_errors
    def varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
                   alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
                   zero_tensors, is_causal, window_size_left, window_size_right, softcap,
                   return_softmax, gen=None, num_splits=0):
        _no_generator(gen)
        result = _flash_attn_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout,
            softmax_scale, is_causal, window_size_left, window_size_right, softcap, alibi_slopes,
            return_softmax, block_table, leftpad_k, seqused_k, zero_tensors, num_splits)
        return (result[0] if out is None else out.copy_(result[0]), *result[1:])

    @staticmethod
    @_fa2_errors
    def bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale,
            is_causal, window_size_left, window_size_right, softcap, deterministic, gen=None,
            rng_state=None):
        _no_generator(gen)
        dq, dk, dv = (torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k),
                                                                          (dv, v)))
        softmax_d = _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, p_dropout,
                                         softmax_scale, is_causal, window_size_left,
                                         window_size_right, softcap, alibi_slopes,
                                         deterministic, rng_state)
        return dq, dk, dv, softmax_d

    @staticmethod
    @_fa2_errors
    def varlen_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                   alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
                   zero_tensors, is_causal, window_size_left, window_size_right, softcap,
                   deterministic, gen=None, rng_state=None):
        _no_generator(gen)
        dq, dk, dv = (torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k),
                                                                          (dv, v)))
        softmax_d = _flash_attn_varlen_backward(
            dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal, window_size_left,
            window_size_right, softcap, alibi_slopes, deterministic, rng_state, zero_tensors)
        return dq, dk, dv, softmax_d


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """FA2's key-block width, which its tests need only to decode S_dmask."""
    raise NotImplementedError("flashgen returns no S_dmask (FlashAttention-2's debug return of "
                              "the dropout pattern), so there is no block layout to decode")
