"""flashgen's torch ops, flashgen::fwd, flashgen::bwd and flashgen::fwd_kvcache: a CUDA kernel, a
fake (meta) implementation for torch.compile and FakeTensorMode, and autograd that connects
them.

Registered with torch.library.Library's define + impl, register_fake and an autograd kernel of
our own (_Attention) rather than torch.library.custom_op or register_autograd: their Python
wrappers cost more per call. On a CPU, with Python kernels that return at once (torch 2.13), a
no-grad call takes 9.7 us through the dispatcher, 22 us through a custom_op, 0.1 us calling the
kernel function; a call that records autograd 35 us through _Attention, 195 us through
register_autograd's kernel. So attention() skips the dispatcher whenever that is invisible (see
_runs_plain_eager), calling the kernel or, where autograd records, _Attention itself: on an H100
host (torch 2.11), a tiny no-grad flash_attn_func call took 52 us that way and 82 us through the
dispatcher, PyTorch's FLASH_ATTENTION SDPA 25 us (one noisy run); on a CPU with the kernels
mocked (torch 2.13), a tiny training call (forward with autograd, backward) 142-144 us that way
and 168-178 us through the dispatcher.
"""

from __future__ import annotations

import operator

import torch

from flashgen import backward, decode, forward, host, loader, replay, variants
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers
from flashgen.op_schema import (BWD, FWD, FWD_KVCACHE, MASK_RANGES, OPS, SAVED, fwd_arguments,
                                mask_ranges_arguments)
from flashgen.validate import SUPPORTED_DTYPES

# pt2_compliant: the ops work under torch.compile (the GPU tests run opcheck). The kernels need the
# head dim innermost with stride 1; fixed stride order keeps inductor from choosing another layout
# for their inputs (its default for custom ops differs across torch versions).
_TAGS = (torch.Tag.pt2_compliant_tag, torch.Tag.needs_fixed_stride_order)
_LIBRARY = torch.library.Library("flashgen", "DEF")
# Each op's arguments are flashgen/op_schema.py's rows: fwd, bwd (fwd's backward), mask_ranges (a
# config-defined variant's mask ranges for q and k as passed to fwd) and fwd_kvcache (attention
# over a KV cache, flash_attn_with_kvcache: k_new and v_new, when given, are appended to the
# caches in place at cache_seqlens; not differentiable).
for _op in OPS.values():
    _LIBRARY.define(_op.schema, tags=_TAGS)
_FWD, _BWD, _FWD_KVCACHE, _MASK_RANGES = (OPS[name] for name in (FWD, BWD, FWD_KVCACHE,
                                                                  MASK_RANGES))


def attention(q, k, v, scale: float, mask: str, band: Band, deterministic: bool,
              heads_first: bool, varlen: tuple = (), mods: Modifiers = PLAIN):
    """out, lse = flashgen::fwd(...) for validated (batch, seq, heads, dim) views of one fp16/bf16
    dtype; band: the mask's run-time arguments; mods: the score modifier's and the variant's.
    Differentiable in q, k and v (not through lse); deterministic only concerns the backward,
    which it makes bit-reproducible. varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) for a variable-length batch packed into (1, total, heads, dim) views."""
    arguments = fwd_arguments(q, k, v, scale, mask, band, deterministic, heads_first, mods,
                              varlen)
    if _runs_plain_eager((q, k, v), records_autograd=True):
        if not torch.is_grad_enabled():
            return _fwd_cuda(*arguments)
        # The op's autograd kernel without the dispatcher: it records a graph where any input
        # (q, k, v, the additive mask) requires grad, and else calls the kernel.
        return _fwd_autograd(None, *arguments)
    return torch.ops.flashgen.fwd.default(*arguments)


def attention_backward(dout, q, k, v, out, lse, scale: float, mask: str, band: Band,
                       deterministic: bool, heads_first: bool, varlen: tuple = (),
                       mods: Modifiers = PLAIN):
    """dq, dk, dv = flashgen::bwd(...) from a forward's out and lse, for callers that keep them
    themselves rather than through autograd (FlashAttention-2's _flash_attn_backward, ring
    attention's per-block backward); the arguments as attention() took them."""
    arguments = fwd_arguments(q, k, v, scale, mask, band, deterministic, heads_first, mods,
                              varlen)
    if missing := _FWD_ARGUMENTS - len(arguments):
        arguments += _FWD_DEFAULTS[-missing:]
    arguments = SAVED.bwd_order((dout, False, *SAVED.tensors(arguments), out, lse,
                                 *SAVED.values(arguments)))
    if _runs_plain_eager(_bwd_inputs(arguments)):
        dq, dk, dv, *_ = _bwd_cuda(*arguments)
    else:
        dq, dk, dv, *_ = torch.ops.flashgen.bwd.default(*arguments)
    return dq, dk, dv


def mask_ranges(variant: str, q, k, tensors: tuple, varlen: tuple = ()):
    """flashgen::mask_ranges(...): a variant's mask ranges for q and k (batch, seq, heads, dim)
    as passed to fwd; varlen as in attention()."""
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen or (None, None, 0, 0)
    arguments = mask_ranges_arguments(q=q, k=k, variant=variant, variant_tensors=tensors,
                                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if _runs_plain_eager((q, k, *tensors)):
        return _mask_ranges_cuda(*arguments)
    return torch.ops.flashgen.mask_ranges.default(*arguments)


@_MASK_RANGES.implements
def _mask_ranges_cuda(q, k, variant, variant_tensor0, variant_tensor1, variant_tensor2,
                      variant_tensor3, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                      max_seqlen_k=0):
    v = variants.resolve(variant)
    varlen = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k)
    launcher = forward.launcher_for(q, SUPPORTED_DTYPES[q.dtype], v.name,
                                    v.name if v.score_mod else "none", varlen)
    tensors = _present(variant_tensor0, variant_tensor1, variant_tensor2, variant_tensor3)
    return variants.compute_mask_ranges(v, q, k, tensors, varlen, launcher)


def _mask_ranges_fake(*arguments):
    a = _MASK_RANGES.view(arguments)
    batch, seqlen_q, seqlen_k = a.q.shape[0], a.q.shape[1], a.k.shape[1]
    if a.cu_seqlens_q is not None:
        batch, seqlen_q, seqlen_k = a.cu_seqlens_q.shape[0] - 1, a.max_seqlen_q, a.max_seqlen_k
    shape = variants.block_mask_shape(variants.resolve(a.variant), batch, a.q.shape[2],
                                      seqlen_q, seqlen_k)
    return a.q.new_empty(shape, dtype=torch.int32)


def _present(*slots) -> tuple:
    """A variant's tensors from the ops' variant_tensor0.. arguments."""
    return tuple(t for t in slots if t is not None)


def _modifiers(softcap, alibi_slopes, attn_bias, sinks, variant, variant_tensors, mask_ranges,
               dropout_p, dropout_seed) -> Modifiers:
    if not variant:
        if (softcap == 0.0 and alibi_slopes is None and attn_bias is None and sinks is None
                and dropout_p == 0.0):
            return PLAIN  # the common call: no object to build
        return Modifiers(softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                         dropout_p=dropout_p, dropout_seed=dropout_seed, sinks=sinks)
    return Modifiers(softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                     variant=variants.resolve(variant), variant_tensors=_present(*variant_tensors),
                     mask_ranges=mask_ranges, dropout_p=dropout_p, dropout_seed=dropout_seed,
                     sinks=sinks)


def nothing_sees_ops() -> bool:
    """No torch.compile, torch.jit.trace, dispatch mode or functorch transform is active: what
    _runs_plain_eager asks of the moment, apart from its tensors."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing()
                or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active())


def _runs_plain_eager(tensors, records_autograd: bool = False) -> bool:
    """Whether calling a CUDA kernel function directly is indistinguishable from calling its op:
    plain CUDA tensors (no subclass such as FakeTensor, no meta or CPU tensor the op would send
    elsewhere), no autograd graph to record (or, with records_autograd, one the caller records
    as the op's autograd kernel would: _fwd_autograd), and nothing that must see the op:
    torch.compile, torch.jit.trace, a dispatch mode (FakeTensorMode, make_fx, FlopCounterMode),
    a functorch transform (vmap). 1.4 to 2.6 us of checks on an H100 host, against 16 to 30 us
    saved."""
    if not nothing_sees_ops():
        return False
    checks_grad = not records_autograd and torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda or (checks_grad and t.requires_grad):
            return False
    return True


def attention_with_kvcache(arguments: tuple, out=None):
    """out, lse = flashgen::fwd_kvcache(*arguments) for validated arguments in its order
    (op_schema.fwd_kvcache_arguments takes them by name). out: the caller's buffer for the output
    (validated), written by the kernel itself on a plain eager call (a CUDA graph's capture
    among them), else copied into."""
    # torch.compile cannot trace an itemgetter: compiling is never the plain eager path anyway.
    if not torch.compiler.is_compiling() and _runs_plain_eager(
            t for t in _kvcache_inputs(arguments) if t is not None):
        if out is not None and out.stride(-1) == 1 and host.is_aligned(out):  # 16-byte stores
            return decode.decode(*arguments, out=out)
        result, lse = decode.decode(*arguments)
    else:
        result, lse = torch.ops.flashgen.fwd_kvcache.default(*arguments)
    return (result, lse) if out is None else (out.copy_(result), lse)


def kvcache_plan(arguments: tuple):
    """The plan decode keeps for a call of attention_with_kvcache with these arguments, which
    calls of their signature may launch directly (decode.run_plan) while nothing_sees_ops();
    None where decode keeps none or such tensors take the op (a subclass, one that requires
    grad)."""
    tensors = [t for t in _kvcache_inputs(arguments) if t is not None]
    if all(type(t) is torch.Tensor and t.is_cuda and not t.requires_grad for t in tensors):
        return decode.plan_of(arguments)
    return None


# The tensors whose kind decides where fwd_kvcache runs (the rest are small int32 and rotary
# tables on the same device).
_kvcache_inputs = operator.itemgetter(*(_FWD_KVCACHE.position[name] for name in (
    "q", "k_cache", "v_cache", "k_new", "v_new")))


@_FWD_KVCACHE.implements
def _fwd_kvcache_cuda(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, scale, window_left,
                      window_right, softcap, alibi_slopes, sinks, rotary_interleaved, num_splits,
                      variant, variant_tensor0, variant_tensor1, variant_tensor2,
                      variant_tensor3, cu_seqlens_q=None, max_seqlen_q=0):
    return decode.decode(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin,
                         cache_seqlens, cache_batch_idx, cache_leftpad, block_table, scale,
                         window_left, window_right, softcap, alibi_slopes, sinks,
                         rotary_interleaved, num_splits, variant, variant_tensor0,
                         variant_tensor1, variant_tensor2, variant_tensor3, cu_seqlens_q,
                         max_seqlen_q)


def _fwd_kvcache_fake(*arguments):
    a = _FWD_KVCACHE.view(arguments)
    return decode.empty_outputs(a.q)


@_FWD.implements
def _fwd_cuda(q, k, v, scale, mask, mask_offset, window_left, window_right, softcap,
              alibi_slopes, attn_bias, sinks, variant, variant_tensor0, variant_tensor1,
              variant_tensor2, variant_tensor3, mask_ranges, dropout_p, dropout_seed,
              deterministic, heads_first, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0):
    return forward.forward(q, k, v, SUPPORTED_DTYPES[q.dtype], scale, mask,
                           Band(mask_offset, window_left, window_right), heads_first,
                           cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                           mods=_modifiers(softcap, alibi_slopes, attn_bias, sinks, variant,
                                           (variant_tensor0, variant_tensor1, variant_tensor2,
                                            variant_tensor3), mask_ranges, dropout_p,
                                           dropout_seed))


def _fwd_fake(*arguments):
    a = _FWD.view(arguments)
    return forward.empty_outputs(a.q, a.heads_first)


@_BWD.implements
def _bwd_cuda(dout, q, k, v, out, lse, attn_bias_grad, scale, mask, mask_offset, window_left,
              window_right, softcap, alibi_slopes, attn_bias, sinks, variant, variant_tensor0,
              variant_tensor1, variant_tensor2, variant_tensor3, mask_ranges, dropout_p,
              dropout_seed, deterministic, heads_first, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=0, max_seqlen_k=0):
    if dout.stride(-1) != 1:  # autograd's dout can be anything, e.g. expanded by out.sum()
        dout = dout.contiguous()
    *grads, dbias, dsinks = backward.backward(
        dout, q, k, v, out, lse, SUPPORTED_DTYPES[q.dtype], scale, mask,
        Band(mask_offset, window_left, window_right), deterministic, heads_first, cu_seqlens_q,
        cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        mods=_modifiers(softcap, alibi_slopes, attn_bias, sinks, variant,
                        (variant_tensor0, variant_tensor1, variant_tensor2, variant_tensor3),
                        mask_ranges, dropout_p, dropout_seed),
        attn_bias_grad=attn_bias_grad)
    if dbias is None:
        dbias = q.new_empty(0, dtype=torch.float32)
    if dsinks is None:
        dsinks = q.new_empty(0, dtype=torch.float32)
    return (*grads, dbias, dsinks)


def _bwd_fake(*arguments):
    """backward.backward's contract: dq, dk, dv shaped like q, k, v and laid out like out; dbias
    (batch, heads, seqlen_q, seqlen_k) fp32 or empty; dsinks like sinks or empty."""
    a = _BWD.view(arguments)
    batch, seqlen_q, heads, _ = a.q.shape
    dbias = (a.q.new_empty(batch, heads, seqlen_q, a.k.shape[1], dtype=torch.float32)
             if a.attn_bias_grad else a.q.new_empty(0, dtype=torch.float32))
    dsinks = (a.q.new_empty(0, dtype=torch.float32) if a.sinks is None
              else torch.empty_like(a.sinks))
    return (*(host.empty_output(t, a.heads_first) for t in (a.q, a.k, a.v)), dbias, dsinks)


# The tensors whose kind decides where bwd runs.
_bwd_inputs = operator.itemgetter(*(_BWD.position[name] for name in (
    "dout", "q", "k", "v", "out", "lse")))
# attn_bias's place among fwd's arguments: its needs_input_grad asks for dbias; sinks' too.
_ATTN_BIAS = _FWD.position["attn_bias"]
_SINKS = _FWD.position["sinks"]


def _save_for_backward(ctx, arguments, output):
    """arguments: fwd's, every one (_fwd_autograd fills the defaults in)."""
    ctx.save_for_backward(*SAVED.tensors(arguments), *output)
    ctx.values = SAVED.values(arguments)
    # lse is not differentiable, as in PyTorch's own flash attention: it gets no gradient, and
    # autograd raises if lse alone is backpropagated. Without materialised gradients, autograd
    # does not allocate and zero one for lse on every backward.
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, dout, _dlse):
    no_gradient = (None,) * len(_FWD.names)
    if dout is None:  # with unmaterialised gradients: nothing reached out
        return no_gradient
    bias_grad = ctx.needs_input_grad[_ATTN_BIAS]
    saved, values = ctx.saved_tensors, ctx.values
    if not bias_grad and nothing_sees_ops():
        grads = replay.backward(dout, *saved, *values)
        if grads is not None:
            return (*grads, *_AFTER_QKV)
    arguments = SAVED.bwd_order((dout, bias_grad, *saved, *values))
    if _runs_plain_eager(_bwd_inputs(arguments)):
        outputs = _bwd_cuda(*arguments)
        if not torch.is_grad_enabled():
            _offer_backward(arguments, (dout, *saved, *values))
    else:
        outputs = torch.ops.flashgen.bwd.default(*arguments)
    gradients = list(no_gradient)
    for position, output in SAVED.gradients:
        gradients[position] = outputs[output]
    if not bias_grad:  # bwd's dbias is then an empty tensor
        gradients[_ATTN_BIAS] = None
    if not ctx.needs_input_grad[_SINKS]:  # no sinks, or sinks that want no gradient
        gradients[_SINKS] = None
    return tuple(gradients)


# The gradients after q's, k's and v's (fwd's first three arguments, as the replay's backward
# gives them): none, for a replayed call has no bias or sinks.
_AFTER_QKV = (None,) * (len(_FWD.names) - 3)
assert tuple(_FWD.position[name] for name in ("q", "k", "v")) == (0, 1, 2)


def _offer_backward(arguments: tuple, given: tuple) -> None:
    """Offers the launch this backward kept (backward.kept_launch) to the compiled replay for
    calls of given's signature (replay.backward's arguments), once per replay generation; none
    is kept where dout was copied (the kept launch reads the copy, laid out otherwise)."""
    if not replay.ready():
        return
    a = _BWD.view(arguments)
    kept = backward.kept_launch(
        a.dout, a.q, a.k, a.v, a.out, a.lse, a.scale, a.mask,
        Band(a.mask_offset, a.window_left, a.window_right), a.deterministic, a.heads_first,
        _modifiers(a.softcap, a.alibi_slopes, a.attn_bias, a.sinks, a.variant,
                   (a.variant_tensor0, a.variant_tensor1, a.variant_tensor2, a.variant_tensor3),
                   a.mask_ranges, a.dropout_p, a.dropout_seed),
        a.cu_seqlens_q is not None, a.attn_bias_grad)
    if kept is not None and kept.offered != replay.generation:
        replay.keep_backward(given, backward.replay_parts(kept), SAVED.replayed, a.heads_first)
        kept.offered = replay.generation


class _Attention(torch.autograd.Function):
    """flashgen::fwd's autograd kernel, as torch.library.register_autograd's own but without its
    per-call fill_defaults, which rebuilds the 27-argument schema's list once per argument: 0.5 ms
    of host time per forward on an H100 host (torch 2.11), more than a short call's GPU time.
    apply(*fwd's arguments, keyset): the keyset last (None where attention() enters it without
    the dispatcher) keeps needs_input_grad in fwd's places."""

    @staticmethod
    def forward(ctx, *arguments_and_keyset):
        *arguments, keyset = arguments_and_keyset
        with loader.gradients_wanted():
            output = _fwd_below_autograd(keyset, arguments)
        _save_for_backward(ctx, arguments, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        return (*_fwd_backward(ctx, dout, dlse), None)


def _fwd_below_autograd(keyset, arguments):
    if keyset is None:  # a plain eager call that skipped the dispatcher (attention)
        return _fwd_cuda(*arguments)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.flashgen.fwd.default.redispatch(
            keyset & torch._C._after_autograd_keyset, *arguments)


# fwd's argument count, and the trailing defaults the dispatcher leaves out of a call that
# passes them unchanged.
_FWD_ARGUMENTS = len(_FWD.names)
_FWD_DEFAULTS = _FWD.defaults


def _fwd_autograd(keyset, *arguments):
    """flashgen::fwd's autograd kernel; keyset None: called by attention() for a plain eager call,
    with no dispatcher around it."""
    if missing := _FWD_ARGUMENTS - len(arguments):
        arguments += _FWD_DEFAULTS[-missing:]
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*arguments):
        return _Attention.apply(*arguments, keyset)
    return _fwd_below_autograd(keyset, arguments)


def _no_double_backward(ctx, *grads):
    """Without this, PyTorch's fallback would backpropagate through bwd as if it were constant
    (silently wrong second derivatives, and only a warning)."""
    raise NotImplementedError("flashgen: double backward (gradients of flashgen's gradients) is "
                              "not supported")


_LIBRARY.impl("fwd", _fwd_cuda, "CUDA")
_LIBRARY.impl("bwd", _bwd_cuda, "CUDA")
_LIBRARY.impl("fwd_kvcache", _fwd_kvcache_cuda, "CUDA")
torch.library.register_fake("flashgen::fwd", _fwd_fake, lib=_LIBRARY)
torch.library.register_fake("flashgen::bwd", _bwd_fake, lib=_LIBRARY)
torch.library.register_fake("flashgen::fwd_kvcache", _fwd_kvcache_fake, lib=_LIBRARY)
_LIBRARY.impl("mask_ranges", _mask_ranges_cuda, "CUDA")
torch.library.register_fake("flashgen::mask_ranges", _mask_ranges_fake, lib=_LIBRARY)
_LIBRARY.impl("fwd", _fwd_autograd, "Autograd", with_keyset=True)
torch.library.register_autograd("flashgen::bwd", _no_double_backward, lib=_LIBRARY)
