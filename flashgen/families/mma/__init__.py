"""The mma family's run-time decisions (codegen/families/mma/ builds its kernels): which of a
head dim's forward tiles runs a call (tile_choice.py), the grids' order and the backward's split
(schedule.py), and the backward's workspaces."""

from __future__ import annotations

import contextlib

import torch

from codegen import params
from codegen.families.mma import resources
from flashgen import host, schedule
from flashgen.band import Band
from flashgen.families.mma import tile_choice
from flashgen.modifiers import PLAIN, Modifiers

# None: tile_choice picks each shape's tile. An index pins that candidate (tools' bench, through
# pinned_forward_tile): read when a shape is first planned, never per call.
_pinned_tile: int | None = None


def forward_plan(candidates, batch_heads: int, seqlen_q: int, device_index: int):
    """The spec that runs a forward call of this shape among a head dim's candidates (the main
    tile first), and its FwdParams fields."""
    if _pinned_tile is None:
        sm_count, _ = host.device_resources(device_index)
        tile = tile_choice.choose_tile([s.tile for s in candidates], batch_heads, seqlen_q,
                                       sm_count)
        spec = next(s for s in candidates if s.tile == tile)
    elif _pinned_tile < len(candidates):
        spec = candidates[_pinned_tile]
    else:
        raise NotImplementedError(f"flashgen: head dim {candidates[0].head_dim} has "
                                  f"{len(candidates)} forward tile(s); tile {_pinned_tile} was "
                                  f"pinned")
    return spec, {"ranks_per_round": schedule.for_spec(spec, seqlen_q)}


@contextlib.contextmanager
def pinned_forward_tile(index: int):
    """Inside, every newly planned forward shape runs candidate `index` of its head dim (0: the
    main tile, 1: the first alt tile). The caller clears the forward's plans around it."""
    global _pinned_tile
    previous, _pinned_tile = _pinned_tile, index
    try:
        yield
    finally:
        _pinned_tile = previous


def backward_args(spec, q, k, v, out, dout, lse, dq, dk, dv, scale: float, band: Band,
                  deterministic: bool, varlen: tuple = (), mods: Modifiers = PLAIN,
                  bias_grad=None):
    """(BwdArgs, the scratch they point into) for the backward kernel `spec` on aligned (batch,
    seq, heads, dim) views; the scratch must live until the launch is queued. varlen:
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a variable-length batch packed
    into (1, total, heads, dim) views. bias_grad: a contiguous (batch, heads, seqlen_q,
    seqlen_k) fp32 tensor for the bias score modifier's gradient, or None."""
    _, _, heads, head_dim = q.shape
    # Of the per-row statistics and the dQ workspace: (batch, heads, seqlen_q), or a packed
    # batch's (heads, total rows), which the launcher zeroes by BwdParams.q_view_rows.
    rows = q.shape[0] * heads * q.shape[1]
    batch, seqlen_q, seqlen_k, sequences = host.problem_sizes(q, k, varlen)
    if varlen:
        # Ordered and split as a dense batch of the longest lengths: blocks past a shorter
        # sequence exit, every piece of a split block alike.
        grid = backward_grid(spec, (batch, seqlen_q, heads, head_dim), (seqlen_k, k.shape[2]),
                             q.get_device(), deterministic)
        sequences = {**sequences, "q_view_rows": q.shape[1], "kv_view_rows": k.shape[1]}
    else:
        grid = backward_grid(spec, q.shape, k.shape[1:3], q.get_device(), deterministic)
    padded_head_dim = resources.padded_head_dim(head_dim)
    # The kernels' fp32 scratch in one allocation (one fewer torch.empty, 5 us of the host path
    # on an H100 host): dQ's workspace (none when deterministic), the split blocks' dK, dV and
    # counter (BwdTraits::kSplitFloats each), then D per query row. Freed after the launch: the
    # caching allocator reuses it in stream order.
    dq_floats = 0 if deterministic else rows * padded_head_dim
    split_floats = grid.split_blocks * (2 * spec.tile.block_n * padded_head_dim + 1)
    scratch = torch.empty(dq_floats + split_floats + rows, dtype=torch.float32, device=q.device)
    address = scratch.data_ptr()
    args = params.bwd_args(
        q=q, k=k, v=v, o=out, dout=dout, dq=dq, dk=dk, dv=dv, softmax_lse=lse.data_ptr(),
        softmax_d=address + 4 * (dq_floats + split_floats),
        dq_accum=0 if deterministic else address, dkv_accum=address + 4 * dq_floats,
        batch=batch, heads=heads, heads_kv=k.shape[2], seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        **mods.fields(scale), **band.fields(),
        sorted_tail_blocks=grid.sorted_tail_blocks, split_blocks=grid.split_blocks,
        splits=grid.splits, attn_bias_grad=0 if bias_grad is None else bias_grad.data_ptr(),
        **sequences)
    return args, scratch


def softmax_d(spec, scratch, q, varlen: tuple = ()):
    """D = rowsum(dout * out) as the backward kernel `spec` left it in its scratch (backward_args'
    layout, the lse's: (batch, heads, seqlen_q), or a packed batch's (1, heads, total rows))."""
    rows = q.shape[0] * q.shape[2] * q.shape[1]
    return scratch[scratch.numel() - rows:]


def backward_grid(spec, q_shape, k_sizes, device_index: int,
                  deterministic: bool) -> schedule.BwdGrid:
    """The grids of the backward kernel `spec` (schedule.py) for q of shape (batch, seqlen_q,
    heads, head_dim) and k_sizes (seqlen_k, heads_kv)."""
    batch, seqlen_q, heads, head_dim = q_shape
    seqlen_k, heads_kv = k_sizes
    group = heads // heads_kv
    sm_count, l2_bytes = host.device_resources(device_index)
    key_blocks = -(-seqlen_k // spec.tile.block_n)
    dq_bytes = group * seqlen_q * resources.padded_head_dim(head_dim) * 4
    uneven = spec.mask_kind.hides_keys
    sorted_tail_blocks = schedule.sorted_tail_blocks(uneven, key_blocks, batch * heads_kv,
                                                     dq_bytes, sm_count, l2_bytes)
    steps = group * -(-seqlen_q // spec.tile.block_m)  # a key block's steps with no mask
    split = schedule.split_tail(uneven, deterministic, key_blocks * batch * heads_kv, steps,
                                sm_count)
    return schedule.BwdGrid(sorted_tail_blocks, *split)
