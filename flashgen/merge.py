"""Attention over disjoint key sets, combined: softmax(q K^T) V over keys A and B together is the
two partial results weighted by their shares of the normaliser,

    lse = log(exp(lse_a) + exp(lse_b)),    out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b,

exact up to fp32 rounding. Serving engines combine a cached prefix's attention with the new
tokens' this way; `combine` takes any number of parts, for a split over the keys.

Composed of torch ops (so it runs on any device and traces under torch.compile), in fp32; a fused
kernel is the inference kernels' to add.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def merge_attention_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                           lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention over keys A and B from the results over each, as flashgen returns
    them: out (batch, seqlen, nheads, headdim), fp16, bf16 or fp32, any strides; lse (batch,
    nheads, seqlen) fp32, natural log. A row with lse -inf on one side (it saw no key there) takes
    the other side's result; on both, output 0 and lse -inf. out has the inputs' dtype, lse is
    fp32; neither is a view of an input."""
    _check_part("out_a", out_a, "lse_a", lse_a)
    _check_part("out_b", out_b, "lse_b", lse_b)
    if out_b.shape != out_a.shape or out_b.dtype != out_a.dtype or out_b.device != out_a.device:
        raise ValueError(f"flashgen: out_a and out_b must match in shape, dtype and device, got "
                         f"{tuple(out_a.shape)} {out_a.dtype} on {out_a.device} and "
                         f"{tuple(out_b.shape)} {out_b.dtype} on {out_b.device}")
    return combine((out_a, out_b), (lse_a, lse_b))


def combine(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]):
    """(out, lse) of attention over the union of the parts' disjoint key sets: outs as
    merge_attention_states' out_a, lses as its lse_a, checked by the caller."""
    lse_parts = torch.stack(tuple(lses))  # (parts, batch, nheads, seqlen)
    lse = torch.logsumexp(lse_parts, dim=0)  # -inf where every part is -inf
    # Against 0 instead of -inf there, so each part's weight is exp(-inf) = 0, not NaN.
    weights = torch.exp(lse_parts - torch.where(torch.isneginf(lse), 0.0, lse))
    out = None
    for part, weight in zip(outs, weights):
        term = part.float() * weight.transpose(1, 2).unsqueeze(-1)
        out = term if out is None else out.add_(term)
    return out.to(outs[0].dtype), lse


def _check_part(out_name: str, out, lse_name: str, lse) -> None:
    for name, t in ((out_name, out), (lse_name, lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashgen: {name} must be a torch.Tensor, got {type(t).__name__}")
    if out.dim() != 4:
        raise ValueError(f"flashgen: {out_name} must be (batch, seqlen, nheads, headdim), got "
                         f"shape {tuple(out.shape)}")
    if out.dtype not in OUT_DTYPES:
        raise TypeError(f"flashgen: {out_name} has dtype {out.dtype}; merge takes float16, "
                        f"bfloat16 or float32 outputs")
    batch, seqlen, heads, _ = out.shape
    if lse.dtype != torch.float32:
        raise TypeError(f"flashgen: {lse_name} must be float32 (as flashgen returns it), got "
                        f"{lse.dtype}")
    if tuple(lse.shape) != (batch, heads, seqlen):
        raise ValueError(f"flashgen: {lse_name} must be (batch, nheads, seqlen) = "
                         f"{(batch, heads, seqlen)} for {out_name} {tuple(out.shape)}, got "
                         f"{tuple(lse.shape)}")
    if lse.device != out.device:
        raise ValueError(f"flashgen: {lse_name} is on {lse.device} and {out_name} on "
                         f"{out.device}; pass them on one device")
