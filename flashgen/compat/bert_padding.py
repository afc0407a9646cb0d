"""FlashAttention-2's flash_attn.bert_padding: between a padded batch (batch, seqlen, ...) with an
attention mask and the packed rows (total, ...) that the varlen functions take."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(tensor, indices):
    """tensor[indices] along the first axis (differentiable)."""
    return tensor.index_select(0, indices)


def index_put_first_axis(values, indices, first_axis_dim: int):
    """A zero tensor of first_axis_dim rows with values at indices (differentiable)."""
    out = values.new_zeros(first_axis_dim, *values.shape[1:])
    return out.index_copy(0, indices, values)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen), nonzero where a token
    takes part; unused_mask likewise for tokens that are allocated but unused (kept in the rows,
    not counted in seqused). Returns (rows (total, ...), indices (total,) into the flattened
    batch, cu_seqlens (batch + 1,) int32, max_seqlen int, seqused (batch,) int32)."""
    kept = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = index_first_axis(hidden_states.flatten(0, 1), indices)
    return rows, indices, cu_seqlens, int(seqlens.max().item()), seqused


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Several short sequences packed in each row: attention_mask_in_length (batch, seqlen)
    holds each row's sequence lengths first, then zeros. Returns (rows, indices, cu_seqlens,
    max_seqlen) over every sequence of every row."""
    seqlen = attention_mask_in_length.shape[-1]
    lengths = attention_mask_in_length.flatten()
    seqlens = lengths[lengths != 0].to(torch.int32)
    used = attention_mask_in_length.sum(dim=-1)
    positions = torch.arange(seqlen, device=used.device).expand(len(used), seqlen)
    indices = torch.nonzero((positions < used.unsqueeze(1)).flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = index_first_axis(hidden_states.flatten(0, 1), indices)
    return rows, indices, cu_seqlens, int(seqlens.max().item())


def pad_input(hidden_states, indices, batch: int, seqlen: int):
    """The inverse of unpad_input: rows (total, ...) back to (batch, seqlen, ...), zeros where the
    mask had none."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.unflatten(0, (batch, seqlen))
