"""FlashAttention-2's flash_attn.layers.rotary.apply_rotary_emb in plain PyTorch (the same
rotation flash_attn_with_kvcache applies in its kernels)."""

from __future__ import annotations

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens; cos, sin
    (seqlen_ro, rotary_dim / 2). Rotates the first rotary_dim columns of each token at position
    seqlen_offsets + i (an int, or (batch,) int per sequence); interleaved pairs columns
    (2j, 2j + 1), else (j, j + rotary_dim / 2). Returns the rotated tensor (x itself when
    inplace)."""
    if cu_seqlens is not None:
        starts = cu_seqlens[:-1].tolist()
        ends = cu_seqlens[1:].tolist()
        offsets = (seqlen_offsets.tolist() if isinstance(seqlen_offsets, torch.Tensor)
                   else [seqlen_offsets] * len(starts))
        out = x if inplace else x.clone()
        for start, end, offset in zip(starts, ends, offsets):
            out[start:end] = apply_rotary_emb(x[start:end].unsqueeze(0), cos, sin, interleaved,
                                              False, offset).squeeze(0)
        return out
    batch, seqlen = x.shape[:2]
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} is more than the head dim {x.shape[-1]}")
    positions = torch.arange(seqlen, device=x.device)
    if isinstance(seqlen_offsets, torch.Tensor):
        positions = positions + seqlen_offsets.to(x.device).long().view(-1, 1)  # (batch, seqlen)
    else:
        positions = (positions + seqlen_offsets).expand(batch, seqlen)
    c = cos[positions].unsqueeze(2).float()  # (batch, seqlen, 1, rotary_dim / 2)
    s = sin[positions].unsqueeze(2).float()
    rotated = x[..., :rotary_dim].float()
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated.chunk(2, dim=-1)
    new_first = first * c - second * s
    new_second = first * s + second * c
    if interleaved:
        rotated = torch.stack((new_first, new_second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((new_first, new_second), dim=-1)
    out = x if inplace else x.clone()
    out[..., :rotary_dim] = rotated.to(x.dtype)
    return out
