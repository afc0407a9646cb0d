"""flashgen as PyTorch's flash attention: SDPA's FLASH_ATTENTION backend, and every other
caller of its ops (context parallel, torch.nn.attention.varlen), on flashgen's kernels.

    import flashgen.integrations.sdpa          # registers "flashgen"
    torch.nn.attention.activate_flash_attention_impl("flashgen")
    with flashgen.integrations.sdpa.enable():  # or for a block: the previous one comes back
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

Activating it overrides the CUDA kernels of aten's flash-attention ops, as torch's own FA3 and
FA4 registrations do: _flash_attention_forward and _backward, _scaled_dot_product_flash_attention
and _backward, and _flash_attention_forward_no_dropout_inplace where torch has it. torch keeps
its backend choice (SDPA picks FLASH_ATTENTION where it would run its FlashAttention-2), its
autograd and its meta kernels (torch.compile). flashgen gives the ops' results as torch's kernel
defines them: out and lse in the ops' layouts, causal aligned bottom-right (what torch's kernel
does; SDPA sends it square causal calls only, and torch's causal_lower_right relies on it),
window_size_left/right and alibi_slopes as FlashAttention-2's, the dropout key in rng_state.
Differences: a query row that sees no key gets lse -inf (torch's kernel: +inf), and
debug_attn_mask is empty. A call flashgen has no configured kernels for (arch, dtype, head dim,
mask, score modifier, dropout, forward and backward both), or that asks for what flashgen does
not return (return_debug_mask, seqused_k, block_table), runs torch's own kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from codegen.arch import arch_for_capability
from flashgen import attention, ops, registry, validate
from flashgen.dispatch import DispatchError
from flashgen.validate import SUPPORTED_DTYPES

NAME = "flashgen"


def enable() -> "_Restoring":
    """Activates flashgen as PyTorch's flash attention, as
    torch.nn.attention.activate_flash_attention_impl("flashgen") does. Used as a context manager
    (with enable(): ...), the implementation active before comes back on exit."""
    if not _HAS_REGISTRY:
        raise RuntimeError(f"flashgen: torch {torch.__version__} has no flash-attention "
                           f"registry (torch.nn.attention.register_flash_attention_impl)")
    previous = torch.nn.attention.current_flash_attention_impl()
    torch.nn.attention.activate_flash_attention_impl(NAME)
    return _Restoring(previous)


@dataclass
class _Restoring:
    previous: str | None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.previous is not None:
            torch.nn.attention.activate_flash_attention_impl(self.previous)
        else:
            torch.nn.attention.restore_flash_attention_impl()


@dataclass
class _Handle:
    """What activation keeps alive: dropping the library drops its kernels, and torch's own
    come back."""
    library: torch.library.Library | None

    def remove(self) -> None:
        self.library = None


def _activate() -> _Handle:
    """The registry's register_fn: flashgen's kernels for the ops this torch has, each with
    torch's own to fall back on."""
    library = torch.library.Library("aten", "IMPL")
    for op, kernel in _KERNELS.items():
        if hasattr(torch.ops.aten, op):
            library.impl(op, functools.partial(kernel, _torch_kernel(op)), "CUDA",
                         with_keyset=True)
    return _Handle(library)


def _torch_kernel(op: str):
    """torch's CUDA kernel of the op, taken before flashgen's replaces it; None where torch has
    none to give (a torch without CUDA kernels, or without torch.library.get_kernel)."""
    get_kernel = getattr(torch.library, "get_kernel", None)
    if get_kernel is None:
        return None
    try:
        return get_kernel(f"aten::{op}", "CUDA")
    except RuntimeError:
        return None


def _run_torch_kernel(kernel, op: str, keyset, *args, **options):
    if kernel is None:
        raise NotImplementedError(f"flashgen: aten::{op} asks for what flashgen has no kernel "
                                  f"for, and this torch gives no kernel of its own to run "
                                  f"instead (torch.library.get_kernel)")
    return kernel.call_boxed(keyset, *args, **options)


def _refuse_with_dropout(op: str, dropout_p: float, what: str) -> None:
    """A call with dropout that torch's kernel runs would meet flashgen's backward, which reads
    the dropout key from rng_state and cannot tell torch's state from it."""
    if dropout_p > 0:
        raise NotImplementedError(f"flashgen: aten::{op} with {what} and dropout_p > 0 is not "
                                  f"supported while flashgen is PyTorch's flash attention; "
                                  f"torch.nn.attention.restore_flash_attention_impl() puts "
                                  f"torch's back")


def _flash_attention_forward(kernel, keyset, query, key, value, cum_seq_q, cum_seq_k, max_q,
                             max_k, dropout_p, is_causal, return_debug_mask, **options):
    """aten::_flash_attention_forward: (output, softmax_logsumexp, rng_state, unused,
    debug_attn_mask). query (batch, seq, heads, dim), or (total, heads, dim) with cum_seq_q."""
    result = None
    refusal = _refusal(return_debug_mask, options)
    if refusal is None:
        result = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          is_causal, options, heads_first=False)
    else:
        _refuse_with_dropout("_flash_attention_forward", dropout_p, refusal)
    if result is None:
        return _run_torch_kernel(kernel, "_flash_attention_forward", keyset, query, key, value,
                                 cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                 return_debug_mask, **options)
    return (*result, query.new_empty(0))


def _flash_attention_forward_no_dropout_inplace(kernel, keyset, out, query, key, value,
                                                cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                                is_causal, return_debug_mask, **options):
    """aten::_flash_attention_forward_no_dropout_inplace: writes the output into out, returns
    softmax_logsumexp."""
    result = None
    if _refusal(return_debug_mask, options) is None and dropout_p == 0:
        result = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          is_causal, options, heads_first=False)
    if result is None:
        return _run_torch_kernel(kernel, "_flash_attention_forward_no_dropout_inplace", keyset,
                                 out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                 dropout_p, is_causal, return_debug_mask, **options)
    out.copy_(result[0])
    return result[1]


def _flash_attention_backward(kernel, keyset, grad_out, query, key, value, out, logsumexp,
                              cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                              rng_state, unused, **options):
    """aten::_flash_attention_backward: (grad_query, grad_key, grad_value)."""
    grads = _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                      max_k, dropout_p, is_causal, rng_state, options, heads_first=False)
    if grads is None:
        return _run_torch_kernel(kernel, "_flash_attention_backward", keyset, grad_out, query,
                                 key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                                 dropout_p, is_causal, rng_state, unused, **options)
    return grads


def _scaled_dot_product_flash_attention(kernel, keyset, query, key, value, dropout_p=0.0,
                                        is_causal=False, return_debug_mask=False, **options):
    """aten::_scaled_dot_product_flash_attention on (batch, heads, seq, dim): (output,
    logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)."""
    result = None
    if not return_debug_mask:
        result = _forward(*_seq_first(query, key, value), None, None, 0, 0, dropout_p,
                          is_causal, options, heads_first=_heads_first(query))
    else:
        _refuse_with_dropout("_scaled_dot_product_flash_attention", dropout_p, "return_debug_mask")
    if result is None:
        return _run_torch_kernel(kernel, "_scaled_dot_product_flash_attention", keyset, query,
                                 key, value, dropout_p, is_causal, return_debug_mask, **options)
    out, lse, rng_state, unused = result
    return (out.transpose(1, 2), lse, None, None, query.shape[2], key.shape[2], rng_state,
            unused, query.new_empty(0))


def _scaled_dot_product_flash_attention_backward(kernel, keyset, grad_out, query, key, value,
                                                 out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                                                 max_k, dropout_p, is_causal, philox_seed,
                                                 philox_offset, **options):
    """aten::_scaled_dot_product_flash_attention_backward: (grad_query, grad_key, grad_value),
    (batch, heads, seq, dim)."""
    grads = _backward(*_seq_first(grad_out, query, key, value, out), logsumexp, None, None, 0,
                      0, dropout_p, is_causal, philox_seed, options,
                      heads_first=_heads_first(query))
    if grads is None:
        return _run_torch_kernel(kernel, "_scaled_dot_product_flash_attention_backward", keyset,
                                 grad_out, query, key, value, out, logsumexp, cum_seq_q,
                                 cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                                 philox_offset, **options)
    return tuple(g.transpose(1, 2) for g in grads)


_KERNELS = {"_flash_attention_forward": _flash_attention_forward,
            "_flash_attention_forward_no_dropout_inplace":
                _flash_attention_forward_no_dropout_inplace,
            "_flash_attention_backward": _flash_attention_backward,
            "_scaled_dot_product_flash_attention": _scaled_dot_product_flash_attention,
            "_scaled_dot_product_flash_attention_backward":
                _scaled_dot_product_flash_attention_backward}


def _refusal(return_debug_mask: bool, options: dict) -> str | None:
    """What of _flash_attention_forward's arguments flashgen does not take, if any (num_splits
    is a choice of torch's kernel: the result is the same)."""
    if return_debug_mask:
        return "return_debug_mask"
    for name in ("seqused_k", "block_table"):
        if options.get(name) is not None:
            return name
    return None


def _seq_first(*tensors):
    """(batch, heads, seq, dim) views as (batch, seq, heads, dim) ones."""
    return tuple(t.transpose(1, 2) for t in tensors)


def _heads_first(query) -> bool:
    """Whether the SDPA op's results are laid out (batch, heads, seq, dim) in memory: its meta
    kernel makes them like query (empty_like), and torch.compile checks what the kernel returns
    against it. Else query's memory is (batch, seq, heads, dim), a projection's transposed view."""
    return query.stride(1) >= query.stride(2)


def _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
             options: dict, heads_first: bool):
    """flashgen's (out, lse, rng_state, unused) in the layouts of _flash_attention_forward, or
    None where flashgen has no kernels for the call. query (batch, seq, heads, dim), or (total,
    heads, dim) with cum_seq_q."""
    arguments = _arguments(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                           is_causal, options)
    if arguments is None:
        return None
    q, k, v, scale, mask, band, varlen, mods = arguments
    if dropout_p > 0:
        mods = validate.with_dropout(mods, validate.check_dropout(dropout_p), q.device)
    with torch.no_grad():  # below autograd: torch's autograd records the op
        out, lse = ops.attention(q, k, v, scale, mask, band, False, heads_first, varlen, mods)
    if varlen:  # (1, total, ...) views back to the op's (total, ...) and lse (heads, total_q)
        out, lse = out.squeeze(0), lse.squeeze(0)
    return out, lse, *_rng_state(mods, q)


def _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
              dropout_p, is_causal, rng_state, options: dict, heads_first: bool):
    """flashgen's (dq, dk, dv) shaped like query, key and value, or None where flashgen has no
    kernels for the call (then it ran torch's forward too: the same check decides both)."""
    arguments = _arguments(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                           is_causal, options)
    if arguments is None:
        return None
    q, k, v, scale, mask, band, varlen, mods = arguments
    if dropout_p > 0:
        mods = validate.with_dropout(mods, validate.check_dropout(dropout_p), q.device,
                                     rng_state.view(torch.int64))
    if varlen:
        grad_out, out, logsumexp = grad_out.unsqueeze(0), out.unsqueeze(0), logsumexp.unsqueeze(0)
    with torch.no_grad():
        grads = ops.attention_backward(grad_out, q, k, v, out, logsumexp, scale, mask, band,
                                       torch.are_deterministic_algorithms_enabled(), heads_first,
                                       varlen, mods)
    return tuple(g.squeeze(0) for g in grads) if varlen else grads


def _arguments(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
               options: dict):
    """flashgen's checked arguments for the op's (q, k, v, scale, mask, band, varlen, mods,
    dropout left out), or None where flashgen has no kernels for the call."""
    if query.dtype not in SUPPORTED_DTYPES:  # torch's kernel raises its own error
        return None
    window = tuple(-1 if w is None else w for w in (options.get("window_size_left"),
                                                    options.get("window_size_right")))
    scale, alibi_slopes = options.get("scale"), options.get("alibi_slopes")
    if cum_seq_q is None:
        q, k, v, scale, mask, band, mods = attention.dense_arguments(
            query, key, value, 0.0, scale, is_causal, window, 0.0, alibi_slopes)
        varlen = ()
    else:
        q, k, v, scale, mask, band, varlen, mods = attention.varlen_arguments(
            query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, 0.0, scale, is_causal,
            window, 0.0, alibi_slopes)
    if not _has_kernels(q.get_device(), SUPPORTED_DTYPES[q.dtype], q.shape[-1], mask,
                        mods.score_mod, dropout_p > 0, bool(varlen)):
        return None
    return q, k, v, scale, mask, band, varlen, mods


@functools.cache
def _has_kernels(device_index: int, dtype: str, head_dim: int, mask: str, score_mod: str,
                 dropout: bool, varlen: bool) -> bool:
    """Whether the config has forward and backward kernels for such calls on this device's arch
    (a head dim that is not configured runs zero-padded to a larger one), for a variable-length
    batch among the families that read one: the forward and the backward of one call decide
    alike."""
    arch = arch_for_capability(*torch.cuda.get_device_capability(device_index))
    try:
        forwards = registry.candidates(arch, "fwd", dtype, head_dim, mask, score_mod,
                                       accepts=lambda f: f.varlen_forward or not varlen,
                                       dropout=dropout)
        backwards = registry.candidates(arch, "bwd", dtype, head_dim, mask, score_mod,
                                        accepts=lambda f: f.varlen_backward or not varlen,
                                        dropout=dropout)
    except DispatchError:
        return False
    return bool(forwards) and bool(backwards)


def _rng_state(mods, q):
    """(rng_state, unused) as the ops return them, (2,) and () uint64 (their meta kernels'
    shapes): the dropout key's bits in rng_state[0], which the backward reads back."""
    state = q.new_zeros(2, dtype=torch.int64)
    if mods.dropout:
        state[:1] = mods.dropout_seed
    return state.view(torch.uint64), q.new_zeros((), dtype=torch.uint64)


_HAS_REGISTRY = hasattr(torch.nn.attention, "register_flash_attention_impl")
if _HAS_REGISTRY:
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=_activate)
