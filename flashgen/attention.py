"""The public functions: FlashAttention-2's flash_attn_func and flash_attn_varlen_func, and a
drop-in for PyTorch's SDPA."""

from __future__ import annotations

import torch

from flashgen import forward, fp8, host, kvcache, ops, replay, validate, variant_args
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, s_aux=None, learnable_sink=None, variant=None,
                    variant_tensors=None, block_mask=None, q_descale=None, k_descale=None,
                    v_descale=None, out_dtype=None):
    """Exact attention, FlashAttention-2's interface.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), with
    nheads a multiple of nheads_kv (GQA/MQA). fp16 or bf16 CUDA tensors (under
    torch.autocast("cuda"), others are cast to its dtype), any strides with the last dimension
    contiguous. window_size=(left, right) limits query i to keys i + seqlen_k - seqlen_q - left
    .. i + seqlen_k - seqlen_q + right (-1: unbounded; causal sets right to 0), and the key blocks
    outside the window are never read. softcap > 0 replaces each scaled score s by
    softcap * tanh(s / softcap). alibi_slopes, fp32 (nheads,) or (batch, nheads), adds
    -slope * |i + seqlen_k - seqlen_q - j| to the scaled score of query i and key j (after the
    cap, with softcap; the slopes get no gradient). dropout_p > 0 zeroes each attention probability with
    that probability and scales the others by 1 / (1 - dropout_p) (training; pass 0 to evaluate):
    the mask is drawn from torch's CUDA generator (torch.manual_seed reproduces it, CUDA graphs
    draw a new one per replay) and the backward regenerates it. The causal mask is aligned to
    the bottom-right corner of the score matrix. s_aux (or learnable_sink, FlashAttention-4's
    name): (nheads,) fp32 sink logits, one per query head, that join every row's softmax
    denominator with no value (gpt-oss, StreamingLLM), in the scaled scores' units; they get a
    gradient. Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs (out,
    softmax_lse, None), softmax_lse (batch, nheads, seqlen_q) in fp32 (natural log), the sink in
    it. A query row that sees no key gets output 0 and lse -inf (its sink, with s_aux).
    Differentiable in q, k and v; softmax_lse is not differentiable (it does not require grad).
    The forward is deterministic; deterministic=True makes the backward bit-reproducible too.

    variant="name" runs a variant the config defines (codegen/variants.py: a mask_mod and/or a
    score_mod in C++), variant_tensors={name: tensor} the tensors it reads; a variant with a
    mask_mod decides visibility alone (causal and window_size off), and block_mask (from
    flashgen.block_mask) spares each call the pass that finds its key blocks. The variant's
    tensors get no gradient. dropout_p > 0 with a variant runs where its table sets dropout =
    true (the default config's document variant does).

    q, k, v in torch.float8_e4m3fn run the 8-bit forward on Hopper (flashgen/fp8.py; forward
    only, no dropout, softcap, ALiBi, sinks or variants): q_descale, k_descale, v_descale, fp32
    (batch, nheads_k) or broadcast to it (FlashAttention-3's), dequantise them (scores scaled
    by q's and k's, the output by v's; None: 1), and out is out_dtype (torch.bfloat16 by
    default, or torch.float16).
    """
    key = None
    plain = (variant is None and variant_tensors is None and block_mask is None
             and q_descale is None and k_descale is None and v_descale is None
             and out_dtype is None)
    if plain:
        if ops.nothing_sees_ops():
            ran = replay.forward(1 if return_attn_probs else 0, q, k, v, dropout_p,
                                 softmax_scale, causal, window_size, softcap, alibi_slopes,
                                 deterministic, s_aux, learnable_sink)
            if ran is not None:
                return ran
    if plain and not torch.compiler.is_compiling():  # dynamo traces no itemgetter
        given = (q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                 deterministic, s_aux, learnable_sink)
        key = _signature(given)
        known = _known.get(key) if key is not None else None
        if (known is not None and not (known.requires_grad and torch.is_grad_enabled())
                and not torch.is_autocast_enabled("cuda") and ops.nothing_sees_ops()):
            if known.offered != replay.generation:  # not loaded then, or it forgot since
                known.offered = _offer(known, given, _DENSE_INPUTS, 4)
            ran = forward.run_kept(known.launch, q, k, v, heads_first=False)
            if ran is not None:
                return (*ran, None) if return_attn_probs else ran[0]
    if fp8.wanted(q, k, v, (q_descale, k_descale, v_descale), out_dtype):
        out, lse = fp8.attention(
            q, k, v, softmax_scale, causal, window_size, (q_descale, k_descale, v_descale),
            out_dtype, dropout_p=(dropout_p, 0.0), softcap=(softcap, 0.0),
            alibi_slopes=(alibi_slopes, None), s_aux=(s_aux, None),
            learnable_sink=(learnable_sink, None), variant=(variant, None),
            variant_tensors=(variant_tensors, None), block_mask=(block_mask, None))
        return (out, lse, None) if return_attn_probs else out
    inputs = q, k, v
    q, k, v, scale, mask, band, mods = dense_arguments(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, variant,
        variant_tensors, block_mask, sinks=validate.sink_argument(s_aux, learnable_sink))
    out, lse = ops.attention(q, k, v, scale, mask, band, bool(deterministic), heads_first=False,
                             mods=mods)
    if key is not None and _keeps(inputs, (q, k, v)):
        known = _know(key, forward.kept_launch(q, k, v, scale, mask, band, False, mods), inputs)
        if known is not None:
            known.offered = _offer(known, given, _DENSE_INPUTS, 4)
    return (out, lse, None) if return_attn_probs else out


# A flash_attn_func or flash_attn_varlen_func call whose signature passed its checks before and
# ran on a kept forward launch (flashgen/forward.py) launches it again directly, checks skipped:
# they depend on the signature alone (a variable-length batch's device values are read on the
# device only, but for FLASHGEN_DEBUG_CHECKS=1, which known calls leave out). Not under autocast
# (it casts before the checks), not where autograd records (the signature's requires_grad with
# grad enabled), not where something sees ops.
MAX_KNOWN = 1024
_known: dict = {}
_signature = host.Signature((0, 1, 2, 8, 10, 11), 12)
_varlen_signature = host.Signature((0, 1, 2, 3, 4, 12, 14, 15, 16), 17)
# Where a known call's inputs (q, k, v, then the sequences' tensors) are in its given tuple.
_DENSE_INPUTS = (0, 1, 2)
_VARLEN_INPUTS = (0, 1, 2, 3, 4)
_SEQUSED_K = 14


def _know(key, launch, inputs: tuple) -> _Known | None:
    if launch is None:
        return None
    if len(_known) >= MAX_KNOWN:
        _known.clear()
    known = _known[key] = _Known(launch, any(t.requires_grad for t in inputs))
    return known


def _offer(known: _Known, given: tuple, input_positions: tuple, q_dims: int) -> int:
    """Offers a known call's launch to the compiled replay (flashgen/replay.py), which takes
    calls without autograd: the replay's generation where it was loaded to be offered it (it
    may still keep none), else -1."""
    if not replay.ready():
        return -1
    if not known.requires_grad:
        parts = forward.replay_parts(known.launch, len(input_positions) - 3, q_dims)
        replay.keep_forward(given, parts, input_positions)
    return replay.generation


def _forget_known() -> None:
    """With forward's kept launches go the known calls and what the compiled replay kept of
    them (a pinned tile or another family must not keep replaying the old launch)."""
    _known.clear()
    replay.forget()


forward.holds_launches(_forget_known)


class _Known:
    __slots__ = ("launch", "requires_grad", "offered")

    def __init__(self, launch, requires_grad: bool):
        self.launch = launch                # forward's kept launch
        # an input that requires grad: autograd records where grad is enabled
        self.requires_grad = requires_grad
        self.offered = -1                   # replay.generation when offered to the replay


def _keeps(given: tuple, checked: tuple) -> bool:
    """Whether a call may be known: its inputs ran as given (no autocast cast; the checked ones
    may be views of them), plain CUDA tensors (no subclass the op would see)."""
    return (not torch.is_autocast_enabled("cuda")
            and all(type(a) is torch.Tensor and a.is_cuda and a.dtype == b.dtype
                    and a.data_ptr() == b.data_ptr() for a, b in zip(given, checked)))


def dense_arguments(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, variant=None,
                    variant_tensors=None, block_mask=None, dropout_seed=None, sinks=None):
    """flash_attn_func's checked arguments as ops.attention takes them: (q, k, v, scale, mask,
    band, mods). dropout_seed: the Philox key of an earlier forward to regenerate its dropout
    mask with (a backward called on its own), else a fresh one is drawn. sinks: s_aux."""
    if dropout_p != 0.0:
        dropout_p = validate.check_dropout(dropout_p)
    q, k, v = _autocast(q, k, v)
    if not validate.passes_tensor_checks(q, k, v, heads_axis=2):
        validate.check_qkv(("q", "k", "v"), q, k, v)
        validate.check_shapes(("q", "k", "v"), q, k, v, "(batch, seqlen, nheads, headdim)")
    _, seqlen_q, _, head_dim = q.shape
    seqlen_k = k.shape[1]
    scale = validate.check_scale(softmax_scale, head_dim)
    if window_size == (-1, -1):  # the common call: no window to check
        mask, band = ("causal" if causal else "none"), Band(seqlen_k - seqlen_q)
    else:
        mask, band = validate.band(causal, window_size, seqlen_q, seqlen_k, seqlen_k - seqlen_q)
    mods = (validate.modifiers(softcap, alibi_slopes, q, q.shape[0])
            if softcap or alibi_slopes is not None else PLAIN)
    if sinks is not None:
        mods = validate.with_sinks(mods, sinks, q)
    if variant is not None or variant_tensors is not None or block_mask is not None:
        mask, band, mods = variant_args.prepare(variant, variant_tensors, block_mask, q, k,
                                                q.shape[0], seqlen_q, seqlen_k, mask, band, mods,
                                                dropout=dropout_p != 0.0)
    if dropout_p != 0.0:
        mods = validate.with_dropout(mods, dropout_p, q.device, dropout_seed)
    return q, k, v, scale, mask, band, mods


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           seqused_k=None, out=None, return_softmax_lse=False, num_splits=0,
                           s_aux=None, learnable_sink=None, variant=None, variant_tensors=None,
                           block_mask=None, q_descale=None, k_descale=None, v_descale=None,
                           out_dtype=None):
    """Exact attention over a batch of sequences of different lengths, FlashAttention-2's
    interface (and the serving engines': seqused_k, out, return_softmax_lse, s_aux).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), the sequences packed one
    after another; cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 on q's device, each sequence's
    first row and then the total (sequences may be empty); max_seqlen_q, max_seqlen_k: ints at
    least the longest lengths (nothing past them is computed; FLASHGEN_DEBUG_CHECKS=1 checks the
    device values). Each sequence's causal mask and window_size are aligned bottom-right;
    dropout_p, softcap, alibi_slopes and a variant as in flash_attn_func (a variant sees
    positions within each sequence and b the sequence's index). s_aux (or learnable_sink):
    (nheads,) fp32 sink logits that join each row's softmax denominator (gpt-oss), with a
    gradient. seqused_k: (batch,) int32, each sequence attends to the first seqused_k[b] keys of
    its run (forward only).

    With block_table ((batch, max_pages) int32), k and v are a paged KV cache (num_pages,
    page_size, nheads_k, headdim), any page size, and each sequence's keys number seqused_k[b]
    (cu_seqlens_k may then be None) or its cu_seqlens_k run's length: vLLM's call, prefill and
    decode rows in one batch, not differentiable, CUDA-graph safe (lengths and tables are read
    on the device only). num_splits as in flash_attn_with_kvcache.

    Returns out (total_q, nheads, headdim) (written into out, when given, which must be that
    shape and q's dtype), with return_softmax_lse (out, softmax_lse), or with return_attn_probs
    (out, softmax_lse, None); softmax_lse (nheads, total_q) fp32. Differentiable in q, k and v
    (and s_aux). Under torch.compile nothing on the device is read on the host.

    q, k, v in torch.float8_e4m3fn run the 8-bit forward as flash_attn_func's (q_descale,
    k_descale, v_descale, out_dtype; no block_table, seqused_k, out or num_splits yet).
    """
    key = None
    plain = (block_table is None and out is None and variant is None and variant_tensors is None
             and block_mask is None and q_descale is None and k_descale is None
             and v_descale is None and out_dtype is None)
    if plain and ops.nothing_sees_ops():
        ran = replay.forward(1 if return_attn_probs else 2 if return_softmax_lse else 0, q, k,
                             v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale, causal, window_size, softcap,
                             alibi_slopes, deterministic, seqused_k, s_aux, learnable_sink)
        if ran is not None:
            return ran
    if plain and not validate.debug_checks() and not torch.compiler.is_compiling():
        given = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                 softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 seqused_k, s_aux, learnable_sink)
        key = _varlen_signature(given)
        known = _known.get(key) if key is not None else None
        if (known is not None and not (known.requires_grad and torch.is_grad_enabled())
                and not torch.is_autocast_enabled("cuda") and ops.nothing_sees_ops()):
            if known.offered != replay.generation:  # not loaded then, or it forgot since
                known.offered = _offer(known, given, _varlen_inputs(seqused_k), 3)
            ran = forward.run_kept(known.launch, q, k, v, False, forward.sequence_tensors(
                (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k)))
            if ran is not None:
                return _varlen_results(*ran, return_attn_probs, return_softmax_lse)
    if max_seqlen_q is None:
        raise ValueError("flashgen: pass max_seqlen_q, the longest query sequence")
    if fp8.wanted(q, k, v, (q_descale, k_descale, v_descale), out_dtype):
        result, lse = fp8.varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_size, (q_descale, k_descale, v_descale), out_dtype,
            dropout_p=(dropout_p, 0.0), softcap=(softcap, 0.0),
            alibi_slopes=(alibi_slopes, None), block_table=(block_table, None),
            seqused_k=(seqused_k, None), out=(out, None), num_splits=(num_splits, 0),
            s_aux=(s_aux, None), learnable_sink=(learnable_sink, None),
            variant=(variant, None), variant_tensors=(variant_tensors, None),
            block_mask=(block_mask, None))
        return _varlen_results(result, lse, return_attn_probs, return_softmax_lse)
    window_size = (-1, -1) if window_size is None else tuple(window_size)
    sinks = validate.sink_argument(s_aux, learnable_sink)
    if block_table is not None:
        if dropout_p != 0.0:
            raise ValueError("flashgen: flash_attn_varlen_func over a paged cache (block_table) "
                             "is inference: pass dropout_p=0")
        if variant is not None or variant_tensors is not None or block_mask is not None:
            raise NotImplementedError("flashgen: a config-defined variant over a paged cache "
                                      "runs through flash_attn_with_kvcache(variant=...)")
        result, lse = kvcache.paged_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, sinks,
            num_splits, out)
    else:
        if cu_seqlens_k is None or max_seqlen_k is None:
            raise ValueError("flashgen: without block_table, pass cu_seqlens_k and max_seqlen_k "
                             "(where each sequence's keys start in k and v, the longest run)")
        if seqused_k is not None and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, sinks)):
            raise NotImplementedError("flashgen: seqused_k is forward only (the backward would "
                                      "need it too); call under torch.no_grad() or trim the "
                                      "runs with cu_seqlens_k")
        if out is not None:
            validate.check_out(out, q)
        q4, k4, v4, scale, mask, band, varlen, mods = varlen_arguments(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, variant, variant_tensors,
            block_mask, sinks=sinks, seqused_k=seqused_k)
        result, lse = ops.attention(q4, k4, v4, scale, mask, band, bool(deterministic),
                                    heads_first=False, varlen=varlen, mods=mods)
        result, lse = result.squeeze(0), lse.squeeze(0)
        if out is not None:
            result = out.copy_(result)
        elif (key is not None and _keeps((q, k, v), (q4, k4, v4))
              and (seqused_k is None or varlen[4] is seqused_k)):  # not a contiguous copy
            known = _know(key, forward.kept_launch(q4, k4, v4, scale, mask, band, False, mods,
                                                   varlen), (q, k, v))
            if known is not None:
                known.offered = _offer(known, given, _varlen_inputs(seqused_k), 3)
    return _varlen_results(result, lse, return_attn_probs, return_softmax_lse)


def _varlen_inputs(seqused_k) -> tuple:
    return _VARLEN_INPUTS if seqused_k is None else (*_VARLEN_INPUTS, _SEQUSED_K)


def _varlen_results(out, lse, return_attn_probs: bool, return_softmax_lse: bool):
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_softmax_lse else out


def varlen_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, variant=None, variant_tensors=None,
                     block_mask=None, dropout_seed=None, sinks=None, seqused_k=None):
    """flash_attn_varlen_func's checked arguments as ops.attention takes them: (q, k, v as (1,
    total, heads, dim) views, scale, mask, band, varlen, mods); dropout_seed and sinks as in
    dense_arguments; seqused_k ((batch,) int32) joins varlen."""
    if dropout_p != 0.0:
        dropout_p = validate.check_dropout(dropout_p)
    q, k, v = _autocast(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"flashgen: {name} must be (total, nheads, headdim), the sequences "
                             f"packed, got shape {tuple(t.shape)}")
    q4, k4, v4 = (t.unsqueeze(0) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    validate.check_qkv(("q", "k", "v"), q4, k4, v4)
    validate.check_shapes(("q", "k", "v"), q4, k4, v4, "(total, nheads, headdim)")
    validate.check_sequences(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = validate.check_scale(softmax_scale, q.shape[-1])
    # Each sequence's band is aligned bottom-right in the kernels; the longest lengths decide
    # which bounds hide nothing for any sequence.
    mask, band = validate.band(causal, window_size, max_seqlen_q, max_seqlen_k,
                               max_seqlen_k - max_seqlen_q)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    batch = cu_seqlens_q.shape[0] - 1
    if seqused_k is not None:
        if variant is not None or variant_tensors is not None or block_mask is not None:
            raise NotImplementedError("flashgen: seqused_k with a config-defined variant is not "
                                      "supported; trim the runs with cu_seqlens_k")
        validate.check_int32("seqused_k", seqused_k, q)
        if seqused_k.shape != (batch,):
            raise ValueError(f"flashgen: seqused_k must have shape ({batch},), the keys each "
                             f"sequence uses, got {tuple(seqused_k.shape)}")
        varlen += (seqused_k.contiguous(),)
    mods = validate.modifiers(softcap, alibi_slopes, q4, batch)
    mods = validate.with_sinks(mods, sinks, q4)
    if variant is not None or variant_tensors is not None or block_mask is not None:
        mask, band, mods = variant_args.prepare(variant, variant_tensors, block_mask, q4, k4,
                                                batch, max_seqlen_q, max_seqlen_k, mask, band,
                                                mods, varlen, dropout=dropout_p != 0.0)
    if dropout_p != 0.0:
        mods = validate.with_dropout(mods, dropout_p, q.device, dropout_seed)
    return q4, k4, v4, scale, mask, band, varlen, mods


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on (batch, heads, seq, dim)
    (or (heads, seq, dim)) fp16/bf16 CUDA tensors, cast to the autocast dtype under
    torch.autocast("cuda") as PyTorch's is. The causal mask is aligned top-left, as PyTorch's.
    attn_mask, broadcastable to (batch, heads, seqlen_q, seqlen_k): boolean (True: the key takes
    part) or added to the scaled scores (every key block is read). dropout_p as in
    flashgen.flash_attn_func (applied whenever it is > 0, as PyTorch's). Differentiable in query,
    key and value, and in a floating attn_mask that requires grad (its backward then runs on the
    mma family, which writes the full (batch, heads, seqlen_q, seqlen_k) fp32 gradient before
    autograd sums it to the mask's shape); the backward is bit-reproducible under
    torch.use_deterministic_algorithms(True)."""
    if dropout_p != 0.0:
        dropout_p = validate.check_dropout(dropout_p)
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
    mods = PLAIN
    if attn_mask is not None:
        if is_causal:
            raise ValueError("flashgen: pass attn_mask or is_causal=True, not both (as PyTorch's "
                             "SDPA); fold the causal mask into attn_mask")
        mods = Modifiers(attn_bias=validate.attn_bias(attn_mask, q, k.shape[1]))
    if dropout_p != 0.0:
        mods = validate.with_dropout(mods, dropout_p, q.device)
    out, _ = ops.attention(q, k, v, softmax_scale, "causal" if is_causal else "none", Band(),
                           deterministic, heads_first=True, mods=mods)  # causal aligned top-left
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
    validate.check_qkv(("query", "key", "value"), query, key, value)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    validate.check_shapes(("query", "key", "value"), q, k, v, "(batch, heads, seq, dim)")
