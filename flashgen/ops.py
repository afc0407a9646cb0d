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

import torch

from codegen import params
from flashgen import backward, decode, forward, variants
from flashgen import host as launch
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers
from flashgen.validate import SUPPORTED_DTYPES

# pt2_compliant: the ops work under torch.compile (the GPU tests run opcheck). The kernels need the
# head dim innermost with stride 1; fixed stride order keeps inductor from choosing another layout
# for their inputs (its default for custom ops differs across torch versions).
_TAGS = (torch.Tag.pt2_compliant_tag, torch.Tag.needs_fixed_stride_order)
_LIBRARY = torch.library.Library("flashgen", "DEF")
# A variant's tensors as separate optional arguments (params.h's slots): a Tensor[] argument would
# make autograd match gradients to the arguments as the caller passed them, defaults left out.
_VARIANT_TENSOR_ARGUMENTS = "".join(f"Tensor? variant_tensor{i}, "
                                    for i in range(params.VARIANT_TENSORS))
# mask: a mask kind (codegen/masks.py); mask_offset, window_left and window_right its per-call
# band (codegen/masks.py's Band, params.h); softcap > 0 caps the scores, alibi_slopes (fp32
# (heads,) or (batch, heads)) and attn_bias (SDPA's attn_mask, additive fp32) bias them; variant
# names a config-defined variant (or ""), with its tensors and its mask's block ranges
# (codegen/score_mods.py's Modifiers, flashgen/variants.py);
# dropout_p > 0 drops probabilities under the Philox key in dropout_seed ((1,) int64, drawn once
# per forward: the backward regenerates the same mask from it, common/dropout.cuh).
# cu_seqlens_q, cu_seqlens_k and the longest lengths make a variable-length batch packed into (1,
# total rows, heads, dim) views (flash_attn_varlen_func); seqused_k and page_table are room the
# kernels refuse until they exist.
_LIBRARY.define("fwd(Tensor q, Tensor k, Tensor v, float scale, str mask, SymInt mask_offset, "
                "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
                "Tensor? attn_bias, str variant, " + _VARIANT_TENSOR_ARGUMENTS +
                "Tensor? mask_ranges, float dropout_p, Tensor? dropout_seed, "
                "bool deterministic, bool heads_first, Tensor? cu_seqlens_q=None, "
                "Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, Tensor? page_table=None, "
                "SymInt max_seqlen_q=0, SymInt max_seqlen_k=0) -> (Tensor out, Tensor lse)",
                tags=_TAGS)
# attn_bias_grad: also the gradient of attn_bias, dbias (batch, heads, seqlen_q, seqlen_k) fp32
# (else an empty tensor).
_LIBRARY.define("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                "bool attn_bias_grad, float scale, str mask, SymInt mask_offset, "
                "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
                "Tensor? attn_bias, str variant, " +
                _VARIANT_TENSOR_ARGUMENTS +
                "Tensor? mask_ranges, float dropout_p, Tensor? dropout_seed, "
                "bool deterministic, bool heads_first, "
                "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, SymInt max_seqlen_q=0, "
                "SymInt max_seqlen_k=0) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias)",
                tags=_TAGS)

# A config-defined variant's mask ranges (flashgen/variants.py) for q and k as passed to fwd, a
# variable-length batch's sizes with them.
_LIBRARY.define("mask_ranges(str variant, Tensor q, Tensor k, Tensor[] variant_tensors, "
                "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, SymInt max_seqlen_q=0, "
                "SymInt max_seqlen_k=0) -> Tensor", tags=_TAGS)

# Attention over a KV cache (flash_attn_with_kvcache): k and v, when given, are appended to the
# caches in place at cache_seqlens; the queries see the band window_left .. window_right around
# their position (bottom-right aligned per sequence, codegen/masks.py); softcap > 0 caps the
# scores, alibi_slopes biases them; num_splits 0 lets flashgen/decode.py choose; variant (a
# config-defined one's name, or "") and its tensors as in fwd. Not differentiable.
_LIBRARY.define("fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, "
                "Tensor? v, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens, "
                "Tensor? cache_batch_idx, Tensor? block_table, float scale, float softcap, "
                "Tensor? alibi_slopes, int window_left, int window_right, "
                "bool rotary_interleaved, int num_splits, str variant=\"\", " +
                _VARIANT_TENSOR_ARGUMENTS.replace(",", "=None,").rstrip(", ") +
                ") -> (Tensor out, Tensor lse)", tags=_TAGS)


def attention(q, k, v, scale: float, mask: str, band: Band, deterministic: bool,
              heads_first: bool, varlen: tuple = (), mods: Modifiers = Modifiers()):
    """out, lse = flashgen::fwd(...) for validated (batch, seq, heads, dim) views of one fp16/bf16
    dtype; band: the mask's run-time arguments; mods: the score modifier's and the variant's.
    Differentiable in q, k and v (not through lse); deterministic only concerns the backward,
    which it makes bit-reproducible. varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) for a variable-length batch packed into (1, total, heads, dim) views."""
    variant = mods.variant
    arguments = (q, k, v, scale, mask, band.offset, band.left, band.right, mods.softcap,
                 mods.alibi_slopes, mods.attn_bias, "" if variant is None else variant.name,
                 *_slots(mods.variant_tensors), mods.mask_ranges, mods.dropout_p,
                 mods.dropout_seed, deterministic, heads_first)
    if varlen:
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen
        arguments += (cu_seqlens_q, cu_seqlens_k, None, None, max_seqlen_q, max_seqlen_k)
    if _runs_plain_eager((q, k, v), records_autograd=True):
        if not torch.is_grad_enabled():
            return _fwd_cuda(*arguments)
        # The op's autograd kernel without the dispatcher: it records a graph where any input
        # (q, k, v, the additive mask) requires grad, and else calls the kernel.
        return _fwd_autograd(None, *arguments)
    return torch.ops.flashgen.fwd.default(*arguments)


def mask_ranges(variant: str, q, k, tensors: tuple, varlen: tuple = ()):
    """flashgen::mask_ranges(...): a variant's mask ranges for q and k (batch, seq, heads, dim)
    as passed to fwd; varlen as in attention()."""
    arguments = (variant, q, k, list(tensors), *varlen)
    if _runs_plain_eager((q, k, *tensors)):
        return _mask_ranges_cuda(*arguments)
    return torch.ops.flashgen.mask_ranges.default(*arguments)


def _mask_ranges_cuda(variant, q, k, tensors, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=0, max_seqlen_k=0):
    v = variants.resolve(variant)
    varlen = () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k)
    launcher = forward.launcher_for(q, SUPPORTED_DTYPES[q.dtype], v.name,
                                    v.name if v.score_mod else "none", varlen)
    return variants.compute_mask_ranges(v, q, k, tuple(tensors), varlen, launcher)


def _mask_ranges_fake(variant, q, k, tensors, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=0, max_seqlen_k=0):
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    if cu_seqlens_q is not None:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    shape = variants.block_mask_shape(variants.resolve(variant), batch, q.shape[2], seqlen_q,
                                      seqlen_k)
    return q.new_empty(shape, dtype=torch.int32)


def _slots(tensors: tuple) -> tuple:
    """A variant's tensors as the ops' variant_tensor0.. arguments."""
    return (*tensors, *(None,) * (params.VARIANT_TENSORS - len(tensors)))


def _modifiers(softcap, alibi_slopes, attn_bias, variant, variant_tensors, mask_ranges,
               dropout_p, dropout_seed) -> Modifiers:
    if not variant:
        if (softcap == 0.0 and alibi_slopes is None and attn_bias is None
                and dropout_p == 0.0):
            return PLAIN  # the common call: no object to build
        return Modifiers(softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                         dropout_p=dropout_p, dropout_seed=dropout_seed)
    tensors = tuple(t for t in variant_tensors if t is not None)
    return Modifiers(softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                     variant=variants.resolve(variant), variant_tensors=tensors,
                     mask_ranges=mask_ranges, dropout_p=dropout_p, dropout_seed=dropout_seed)


def _runs_plain_eager(tensors, records_autograd: bool = False) -> bool:
    """Whether calling a CUDA kernel function directly is indistinguishable from calling its op:
    plain CUDA tensors (no subclass such as FakeTensor, no meta or CPU tensor the op would send
    elsewhere), no autograd graph to record (or, with records_autograd, one the caller records
    as the op's autograd kernel would: _fwd_autograd), and nothing that must see the op:
    torch.compile, torch.jit.trace, a dispatch mode (FakeTensorMode, make_fx, FlopCounterMode),
    a functorch transform (vmap). 1.4 to 2.6 us of checks on an H100 host, against 16 to 30 us
    saved."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active()):
        return False
    checks_grad = not records_autograd and torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda or (checks_grad and t.requires_grad):
            return False
    return True


def attention_with_kvcache(*arguments, variant: str = "", variant_tensors: tuple = ()):
    """out, lse = flashgen::fwd_kvcache(*arguments, variant, *variant_tensors) for validated
    arguments in its schema's order."""
    arguments = (*arguments, variant, *_slots(variant_tensors))
    if _runs_plain_eager(t for t in arguments[:5] if t is not None):
        return decode.decode(*arguments)
    return torch.ops.flashgen.fwd_kvcache.default(*arguments)


def _fwd_kvcache_fake(q, *_):
    batch, seqlen_q, heads, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(batch, heads, seqlen_q, dtype=torch.float32))


def _fwd_cuda(q, k, v, scale, mask, mask_offset, window_left, window_right, softcap,
              alibi_slopes, attn_bias, variant, vt0, vt1, vt2, vt3, mask_ranges,
              dropout_p, dropout_seed, deterministic, heads_first, *layout):
    return forward.forward(q, k, v, SUPPORTED_DTYPES[q.dtype], scale, mask,
                           Band(mask_offset, window_left, window_right), heads_first, *layout,
                           mods=_modifiers(softcap, alibi_slopes, attn_bias, variant,
                                           (vt0, vt1, vt2, vt3), mask_ranges, dropout_p,
                                           dropout_seed))


def _fwd_fake(q, k, v, scale, mask, mask_offset, window_left, window_right, softcap,
              alibi_slopes, attn_bias, variant, vt0, vt1, vt2, vt3, mask_ranges,
              dropout_p, dropout_seed, deterministic, heads_first, *layout):
    return forward.empty_outputs(q, heads_first)


def _bwd_cuda(dout, q, k, v, out, lse, attn_bias_grad, scale, mask, mask_offset, window_left,
              window_right, softcap, alibi_slopes, attn_bias, variant, vt0, vt1, vt2, vt3,
              mask_ranges, dropout_p, dropout_seed, deterministic, heads_first, *layout):
    if dout.stride(-1) != 1:  # autograd's dout can be anything, e.g. expanded by out.sum()
        dout = dout.contiguous()
    *grads, dbias = backward.backward(
        dout, q, k, v, out, lse, SUPPORTED_DTYPES[q.dtype], scale, mask,
        Band(mask_offset, window_left, window_right), deterministic, heads_first, *layout,
        mods=_modifiers(softcap, alibi_slopes, attn_bias, variant, (vt0, vt1, vt2, vt3),
                        mask_ranges, dropout_p, dropout_seed),
        attn_bias_grad=attn_bias_grad)
    return (*grads, q.new_empty(0, dtype=torch.float32) if dbias is None else dbias)


def _bwd_fake(dout, q, k, v, out, lse, attn_bias_grad, scale, mask, mask_offset, window_left,
              window_right, softcap, alibi_slopes, attn_bias, variant, vt0, vt1, vt2, vt3,
              mask_ranges, dropout_p, dropout_seed, deterministic, heads_first, *layout):
    """backward.backward's contract: dq, dk, dv shaped like q, k, v and laid out like out; dbias
    (batch, heads, seqlen_q, seqlen_k) fp32 or empty."""
    batch, seqlen_q, heads, _ = q.shape
    dbias = (q.new_empty(batch, heads, seqlen_q, k.shape[1], dtype=torch.float32)
             if attn_bias_grad else q.new_empty(0, dtype=torch.float32))
    return (*(launch.empty_output(t, heads_first) for t in (q, k, v)), dbias)


# flashgen::fwd's arguments scale (3) to heads_first (20) are bwd's too, in its order; among them
# (counted from scale) the tensors alibi_slopes, attn_bias, variant_tensor0..3, mask_ranges and
# dropout_seed.
_SHARED = slice(3, 21)
_SHARED_TENSORS = (6, 7, 9, 10, 11, 12, 13, 15)
_FWD_ARGUMENTS = 27
_ATTN_BIAS = 10  # attn_bias's place among fwd's arguments


def _save_for_backward(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    shared = list(inputs[_SHARED])
    ctx.save_for_backward(q, k, v, out, lse, *(shared[i] for i in _SHARED_TENSORS))
    for i in _SHARED_TENSORS:  # saved above
        shared[i] = None
    ctx.arguments = shared
    # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k (None, None, 0, 0 unless varlen)
    ctx.varlen = (*inputs[21:23], *inputs[25:27])
    # lse is not differentiable, as in PyTorch's own flash attention: it gets no gradient, and
    # autograd raises if lse alone is backpropagated. Without materialised gradients, autograd
    # does not allocate and zero one for lse on every backward.
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, dout, _dlse):
    no_gradient = (None,) * _FWD_ARGUMENTS
    if dout is None:  # with unmaterialised gradients: nothing reached out
        return no_gradient
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    shared = list(ctx.arguments)
    for i, tensor in zip(_SHARED_TENSORS, tensors):
        shared[i] = tensor
    bias_grad = ctx.needs_input_grad[_ATTN_BIAS]
    arguments = (dout, q, k, v, out, lse, bias_grad, *shared, *ctx.varlen)
    if _runs_plain_eager(arguments[:6]):
        dq, dk, dv, dbias = _bwd_cuda(*arguments)
    else:
        dq, dk, dv, dbias = torch.ops.flashgen.bwd.default(*arguments)
    gradients = [dq, dk, dv, *no_gradient[3:]]
    if bias_grad:
        gradients[_ATTN_BIAS] = dbias
    return tuple(gradients)


# Trailing arguments the dispatcher leaves out when they equal their defaults (cu_seqlens_q to
# max_seqlen_k), for the saved arguments' fixed places.
_FWD_DEFAULTS = (None, None, None, None, 0, 0)


class _Attention(torch.autograd.Function):
    """flashgen::fwd's autograd kernel, as torch.library.register_autograd's own but without its
    per-call fill_defaults, which rebuilds the 27-argument schema's list once per argument: 0.5 ms
    of host time per forward on an H100 host (torch 2.11), more than a short call's GPU time.
    apply(*fwd's arguments, keyset): the keyset last (None where attention() enters it without
    the dispatcher) keeps needs_input_grad in fwd's places."""

    @staticmethod
    def forward(ctx, *arguments_and_keyset):
        *arguments, keyset = arguments_and_keyset
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
_LIBRARY.impl("fwd_kvcache", decode.decode, "CUDA")
torch.library.register_fake("flashgen::fwd", _fwd_fake, lib=_LIBRARY)
torch.library.register_fake("flashgen::bwd", _bwd_fake, lib=_LIBRARY)
torch.library.register_fake("flashgen::fwd_kvcache", _fwd_kvcache_fake, lib=_LIBRARY)
_LIBRARY.impl("mask_ranges", _mask_ranges_cuda, "CUDA")
torch.library.register_fake("flashgen::mask_ranges", _mask_ranges_fake, lib=_LIBRARY)
_LIBRARY.impl("fwd", _fwd_autograd, "Autograd", with_keyset=True)
torch.library.register_autograd("flashgen::bwd", _no_double_backward, lib=_LIBRARY)
