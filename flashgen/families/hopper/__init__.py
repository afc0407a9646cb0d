"""The hopper family's run-time decisions (codegen/families/hopper/ builds its kernels): which of
a head dim's forward tiles runs a call, and the backward's grid order and workspaces.

A head dim's (or a mask's) alt tiles are short-sequence tiles. The main tiles are sized for long
rows; on short ones a smaller tile wastes fewer rows past the sequence and less work on the
causal diagonal, and a narrower block_n can leave room for an output buffer of its own (so the
blocks walk tiles). Measured on the H100 (bf16, causal, against the main tile, two runs each;
docs/performance.md, "The hopper forward"): head dim 64 at 128 x 128 instead of 192 x 128 ran
+13-18% at seqlen 512-1k, level at 2k and 6-8% slower from 4k; head dim 192 at block_n 64
instead of 112 +20% at 512, level at 2k, 7% slower from 4k. So the first alt tile runs calls of
at most SHORT_SEQLEN query rows. The plan is cached per seqlen_q, not seqlen_k: a short query
block against a long cache (chunked prefill) counts as short.
"""

from __future__ import annotations

import torch

from codegen import params
from codegen.families.hopper.resources import backward_consumers
from flashgen import host, schedule
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers

SHORT_SEQLEN = 1024


def forward_plan(candidates, batch_heads: int, seqlen_q: int, device_index: int):
    """The spec that runs a forward call of this shape among a head dim's candidates (the main
    tile first), and its FwdParams fields (none beyond the shared ones; the forward adds the
    tile counter per call)."""
    main, *alts = candidates
    return (alts[0] if alts and seqlen_q <= SHORT_SEQLEN else main), {}


def backward_args(spec, q, k, v, out, dout, lse, dq, dk, dv, scale: float, band: Band,
                  deterministic: bool, varlen: tuple = (), mods: Modifiers = PLAIN,
                  bias_grad=None):
    """(BwdArgs, the scratch they point into) for the backward kernel `spec` on aligned (batch,
    seq, heads, dim) views. varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of
    a variable-length batch packed into (1, total, heads, dim) views, whose main kernel's grid
    is a dense batch's of the longest lengths (ordered and split as one; blocks past a shorter
    sequence exit) and whose helper kernels' grids run over its own query blocks. The kernels'
    fp32 scratch in one allocation, rows padded to whole query blocks per (sequence, head)
    (QueryBlockLayout in hopper/bwd_aux.cuh: a packed batch's take its total rows plus a query
    block per sequence, per head): the dQ workspace, D, lse * log2(e), then
    the order of dQ's adds (deterministic: one int per query block and consumer warpgroup) or
    each query block's dQ state (padded to 16 bytes), then the split blocks' dK, dV and counters
    (BwdTraits::kSplitFloats each)."""
    assert bias_grad is None, "dispatch sends a bias gradient to a family that writes one"
    _, _, heads, head_dim = q.shape
    batch, seqlen_q, seqlen_k, sequences = host.problem_sizes(q, k, varlen)
    block_m = spec.tile.block_m
    if varlen:
        query_blocks = heads * ((q.shape[1] + batch * block_m) // block_m)
    else:
        query_blocks = batch * heads * -(-seqlen_q // block_m)
    rows = query_blocks * block_m
    grid = backward_grid(spec, (batch, seqlen_q, heads, head_dim), (seqlen_k, k.shape[2]),
                         q.get_device(), deterministic)
    consumers = backward_consumers(head_dim, spec.tile.block_n)
    order_ints = query_blocks * consumers if deterministic else -(-query_blocks // 4) * 4
    split_floats = grid.split_blocks * (2 * spec.tile.block_n * head_dim + 1)
    scratch = torch.empty(rows * (head_dim + 2) + order_ints + split_floats, dtype=torch.float32,
                          device=q.device)
    address = scratch.data_ptr()
    order = address + 4 * rows * (head_dim + 2)
    # The packed views' rows bound the TMA descriptors (BwdParams.q_view_rows).
    views = {"q_view_rows": q.shape[1], "kv_view_rows": k.shape[1]} if varlen else {}
    args = params.bwd_args(
        q=q, k=k, v=v, o=out, dout=dout, dq=dq, dk=dk, dv=dv, softmax_lse=lse.data_ptr(),
        dq_accum=address, softmax_d=address + 4 * rows * head_dim,
        softmax_lse_log2=address + 4 * rows * (head_dim + 1),
        dq_semaphore=order if deterministic else 0, dq_state=0 if deterministic else order,
        dkv_accum=order + 4 * order_ints if split_floats else 0,
        batch=batch, heads=heads, heads_kv=k.shape[2], seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        sorted_tail_blocks=grid.sorted_tail_blocks, split_blocks=grid.split_blocks,
        splits=grid.splits,
        deterministic_rotation=(deterministic_rotation(spec, seqlen_k, q.get_device())
                                if deterministic and not varlen else 0),
        **mods.fields(scale), **band.fields(), **sequences, **views)
    return args, scratch


def softmax_d(spec, scratch, q, varlen: tuple = ()):
    """D = rowsum(dout * out) as the backward kernel `spec` left it in its scratch (backward_args'
    layout), laid out as the lse: (batch, heads, seqlen_q), or a packed batch's (1, heads, total
    rows), gathered from QueryBlockLayout's rows (each sequence's from a whole query block)."""
    batch, total, heads, head_dim = q.shape
    block_m = spec.tile.block_m
    if not varlen:
        per_head = -(-total // block_m) * block_m
        rows = batch * heads * per_head
        d = scratch[rows * head_dim:rows * (head_dim + 1)]
        return d.view(batch, heads, per_head)[..., :total]
    cu_seqlens_q = varlen[0]
    sequences = cu_seqlens_q.numel() - 1
    per_head = (total + sequences * block_m) // block_m * block_m  # PackedQueryBlocks::per_head
    rows = heads * per_head
    d = scratch[rows * head_dim:rows * (head_dim + 1)].view(heads, per_head)
    row = torch.arange(total, device=q.device, dtype=cu_seqlens_q.dtype)
    sequence = torch.searchsorted(cu_seqlens_q[1:], row, right=True)
    first_row = cu_seqlens_q[sequence].long()
    at = (first_row + sequence * block_m) // block_m * block_m + row - first_row
    return d[:, at].unsqueeze(0)


# A deterministic run's key blocks walk rotated where a (batch, KV head)'s are at most the SMs
# over this. Measured on the H100 against walks in order (bf16, every hopper head dim): +6-17% at
# 16-32 key blocks a head (2k), level to +6% at 64 (8k), 2-9% slower at 128, where the next head's
# first blocks, launched into the wave's last SMs, wait for blocks of their head not yet running.
DETERMINISTIC_ROTATION_HEADS_PER_WAVE = 4


def deterministic_rotation(spec, seqlen_k: int, device_index: int) -> int:
    """BwdParams.deterministic_rotation: 1 without a mask where a (batch, KV head)'s key blocks
    fill at most 1 / DETERMINISTIC_ROTATION_HEADS_PER_WAVE of the SMs. Its key blocks' walks
    then start their own share of the way in and each query block's turns follow the order they
    reach it, so a block may wait on any block of its head (the grid runs one head's key blocks
    after another, so those of a head no wider than the GPU all run at once: no hang). Else the
    key blocks walk in order, each query block's turns descend, and the grid launches each
    head's last key block first, so a block only ever waits on blocks launched before it."""
    sm_count, _ = host.device_resources(device_index)
    key_blocks = -(-seqlen_k // spec.tile.block_n)
    return int(not spec.mask_kind.hides_keys
               and key_blocks * DETERMINISTIC_ROTATION_HEADS_PER_WAVE <= sm_count)


def backward_grid(spec, q_shape, k_sizes, device_index: int,
                  deterministic: bool) -> schedule.BwdGrid:
    """The grid of the backward kernel `spec` for q of shape (batch, seqlen_q, heads, head_dim)
    and k_sizes (seqlen_k, heads_kv), as the mma family's (schedule.py): one (batch, KV head)'s
    key blocks after another, the longest first; under a mask that gives them unequal walks the
    last (batch, KV head)s interleave theirs longest first across them, so that no long block
    starts in the grid's last wave; without one, the last wave's blocks run in pieces. A
    deterministic run keeps its own order (deterministic_rotation) and splits nothing. A
    variable-length batch's grid is that of a dense batch of its longest lengths."""
    if deterministic:
        return schedule.BwdGrid()
    batch, seqlen_q, heads, head_dim = q_shape
    seqlen_k, heads_kv = k_sizes
    sm_count, l2_bytes = host.device_resources(device_index)
    key_blocks = -(-seqlen_k // spec.tile.block_n)
    query_blocks = -(-seqlen_q // spec.tile.block_m)
    group = heads // heads_kv
    if spec.mask_kind.hides_keys:
        dq_bytes = group * query_blocks * spec.tile.block_m * head_dim * 4
        return schedule.BwdGrid(schedule.sorted_tail_blocks(
            True, key_blocks, batch * heads_kv, dq_bytes, sm_count, l2_bytes))
    return schedule.BwdGrid(0, *schedule.split_tail(
        False, False, key_blocks * batch * heads_kv, group * query_blocks, sm_count))
