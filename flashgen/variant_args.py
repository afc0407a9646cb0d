"""A public call's config-defined variant arguments (variant=, variant_tensors=, block_mask=):
their checks, what the torch ops take in their place (the mask kind, band and modifiers), and
flashgen.block_mask, which computes a variant mask's block mask once for calls that share it, as
FlexAttention's create_block_mask does (flashgen/variants.py holds the layout and its kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codegen.variants import DTYPES, Variant
from flashgen import ops, variants
from flashgen.band import Band
from flashgen.dispatch import DispatchError
from flashgen.modifiers import PLAIN, Modifiers


@dataclass(frozen=True)
class BlockMask:
    """A variant's mask ranges for one batch of sizes and one content of its tensors: pass it as
    block_mask= to every call that shares them, and build it again when the tensors change."""
    variant: str
    ranges: torch.Tensor  # variants.block_mask_shape(...) int32
    batch: int
    seqlen_q: int
    seqlen_k: int

    @property
    def heads(self) -> int:
        """The query heads it holds a mask for (1: one for every head)."""
        return self.ranges.shape[1]


def block_mask(variant: str, q, k, variant_tensors: dict | None = None, cu_seqlens_q=None,
               cu_seqlens_k=None, max_seqlen_q: int | None = None,
               max_seqlen_k: int | None = None) -> BlockMask:
    """The block mask of variant's mask_mod for calls with q and k of these shapes (as passed to
    flash_attn_func, or packed with cu_seqlens_q/k and the longest lengths as passed to
    flash_attn_varlen_func)."""
    v = variants.resolve(variant)
    if not v.mask_mod:
        raise ValueError(f"flashgen: variant {v.name!r} has no mask_mod: it needs no block mask")
    if cu_seqlens_q is None:
        batch, seqlen_q, seqlen_k, varlen = q.shape[0], q.shape[1], k.shape[1], ()
    else:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
        q, k = q.unsqueeze(0), k.unsqueeze(0)
        varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    tensors = check_variant_tensors(v, variant_tensors, q, k, batch, seqlen_q, seqlen_k)
    ranges = ops.mask_ranges(v.name, q, k, tensors, varlen)  # the op, so that torch.compile sees it
    return BlockMask(v.name, ranges, batch, seqlen_q, seqlen_k)


def check_variant_tensors(variant: Variant, tensors, q, k, batch: int, seqlen_q: int,
                          seqlen_k: int) -> tuple[torch.Tensor, ...]:
    """The variant's tensors in its table's order, contiguous, after checking names, dtypes,
    devices and the dims its table names. q, k: (batch, seq, heads, dim) views."""
    tensors = dict(tensors or {})
    names = [t.name for t in variant.tensors]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(f"flashgen: variant {variant.name!r} reads tensor(s) {missing}: pass "
                         f"variant_tensors={{{', '.join(repr(n) + ': ...' for n in names)}}}")
    unknown = sorted(set(tensors) - set(names))
    if unknown:
        raise ValueError(f"flashgen: variant {variant.name!r} reads no tensor(s) {unknown}; it "
                         f"reads {names}")
    sizes = {"batch": batch, "heads": q.shape[2], "heads_kv": k.shape[2], "seqlen_q": seqlen_q,
             "seqlen_k": seqlen_k}
    checked = []
    for declared in variant.tensors:
        t = tensors[declared.name]
        where = f"variant {variant.name!r}'s tensor {declared.name!r}"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashgen: {where} must be a torch.Tensor, got {type(t).__name__}")
        dtype = getattr(torch, DTYPES[declared.dtype][1])
        if t.dtype != dtype:
            raise TypeError(f"flashgen: {where} must be {dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"flashgen: {where} is on {t.device}, q on {q.device}")
        expected = declared.expected_shape(sizes)
        if t.dim() != len(expected) or any(e is not None and e != n
                                           for e, n in zip(expected, t.shape)):
            raise ValueError(f"flashgen: {where} must have shape [{', '.join(declared.dims)}] = "
                             f"{tuple('*' if e is None else e for e in expected)}, got "
                             f"{tuple(t.shape)}")
        if not 0 < t.numel() < 2**31:
            raise ValueError(f"flashgen: {where} has {t.numel()} elements; kernels index a "
                             f"variant tensor with 32-bit offsets: 1 to 2^31 - 1 elements")
        if t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"flashgen: {where} requires grad, but variant tensors get no "
                             f"gradient; pass it detached (.detach())")
        checked.append(t.contiguous())
    return tuple(checked)


def prepare(name, variant_tensors, block_mask_: BlockMask | None, q, k, batch: int,
            seqlen_q: int, seqlen_k: int, mask: str, band: Band, mods: Modifiers,
            varlen: tuple = (), dropout: bool = False) -> tuple[str, Band, Modifiers]:
    """(mask kind, band, modifiers) of a call with variant=name: the variant's own mask where it
    has a mask_mod (the call's causal and window_size must then be off), its score modifier in
    place of softcap and ALiBi (which it does not combine with). dropout: the call has
    dropout_p > 0, which needs the variant's kernels built with it."""
    if name is None:
        raise ValueError("flashgen: variant_tensors and block_mask go with variant=\"<name>\"")
    v = variants.resolve(name)
    if dropout and not v.dropout:
        raise DispatchError(f"flashgen: variant {v.name!r} is built without dropout: set "
                            f"dropout = true in its [variants.{v.name}] table and run `flashgen "
                            f"generate`, or pass dropout_p=0")
    if v.mask_mod:
        if mask != "none":
            raise ValueError(f"flashgen: variant {v.name!r} has its own mask_mod; pass "
                             f"causal=False and window_size=(-1, -1) (write causality into "
                             f"the mask_mod)")
        mask = v.name
    elif block_mask_ is not None:
        raise ValueError(f"flashgen: variant {v.name!r} has no mask_mod: pass no block_mask")
    if v.score_mod and mods is not PLAIN:
        raise NotImplementedError(f"flashgen: variant {v.name!r} has its own score_mod; "
                                  f"softcap and alibi_slopes do not combine with it")
    tensors = check_variant_tensors(v, variant_tensors, q, k, batch, seqlen_q, seqlen_k)
    ranges = None
    if v.mask_mod and block_mask_ is not None:
        if not isinstance(block_mask_, BlockMask):
            raise TypeError(f"flashgen: block_mask must come from flashgen.block_mask(), got "
                            f"{type(block_mask_).__name__}")
        found = (block_mask_.variant, block_mask_.batch, block_mask_.heads,
                 block_mask_.seqlen_q, block_mask_.seqlen_k)
        call = (v.name, batch, q.shape[2] if v.per_head else 1, seqlen_q, seqlen_k)
        if found != call:
            raise ValueError(f"flashgen: block_mask was built for variant, batch, heads (1: "
                             f"shared), seqlen_q, seqlen_k = {found}, this call is {call}")
        ranges = block_mask_.ranges
    elif v.mask_mod:
        ranges = ops.mask_ranges(v.name, q, k, tensors, varlen)
    return mask, band, Modifiers(softcap=mods.softcap, alibi_slopes=mods.alibi_slopes, variant=v,
                                 variant_tensors=tensors, mask_ranges=ranges)


def prepare_decode(name, variant_tensors, q, k_cache, batch: int, seqlen_q: int, capacity: int,
                   mask: str, mods: Modifiers) -> tuple[str, tuple[torch.Tensor, ...]]:
    """(name, checked tensors) of a flash_attn_with_kvcache call with variant=name: a variant
    built with decode kernels, its mask alone (no causal or window_size), its score modifier
    alone (no softcap or ALiBi). Its tensors' seqlen_k is the cache's capacity."""
    if name is None:
        raise ValueError("flashgen: variant_tensors go with variant=\"<name>\"")
    v = variants.resolve(name)
    if not v.kvcache:
        raise DispatchError(f"flashgen: variant {v.name!r} has no KV-cache kernels: set kvcache "
                            f"= true in its [variants.{v.name}] table and run `flashgen "
                            f"generate`")
    if v.mask_mod and mask != "none":
        raise ValueError(f"flashgen: variant {v.name!r} has its own mask_mod; pass "
                         f"causal=False and window_size=(-1, -1) (write causality into the "
                         f"mask_mod)")
    if v.score_mod and mods is not PLAIN:
        raise NotImplementedError(f"flashgen: variant {v.name!r} has its own score_mod; "
                                  f"softcap and alibi_slopes do not combine with it")
    return v.name, check_variant_tensors(v, variant_tensors, q, k_cache, batch, seqlen_q, capacity)
