"""The backward pass on (batch, seq, heads, dim) views: gradients of q, k and v from the forward's
output and log-sum-exp (FlashAttention-2: nothing of size seqlen_q x seqlen_k is stored)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from codegen import resources
from codegen.arch import arch_for_capability
from flashgen import forward, loader, registry, schedule, validate

_LOG2_E = math.log2(math.e)


def backward(dout, q, k, v, out, lse, dtype: str, scale: float, causal: bool,
             causal_offset: int, deterministic: bool, heads_first: bool):
    """dq, dk, dv with the shapes of q, k, v.

    dout, q, k, v, out: (batch, seq, heads, dim) views of one fp16/bf16 dtype (`dtype` is its short
    name), already validated by the forward; lse: (batch, heads, seqlen_q) fp32 from the forward.
    causal_offset as in the forward (key j visible to query i iff j <= i + causal_offset).
    deterministic=True gives bit-identical gradients across runs. The gradients are allocated as
    the forward's output is (forward.empty_output): heads_first=True lays them out in memory as
    (batch, heads, seq, dim), SDPA's layout, with (batch, seq, heads, dim) shapes.
    """
    grads = tuple(forward.empty_output(t, heads_first) for t in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: nothing flows back
        return tuple(g.zero_() for g in grads)
    head_dim = q.shape[-1]
    launcher, padded_head_dim = _choose(q.get_device(), dtype, head_dim, causal)
    if padded_head_dim is not None:  # zero-padded: exact, the padded columns are dropped
        pad = (0, padded_head_dim - head_dim)
        inputs = [F.pad(t, pad) for t in (q, k, v, out, dout)]
        work = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in inputs[:3])
    else:
        inputs = [t if validate.is_aligned(t) else t.contiguous() for t in (q, k, v, out, dout)]
        work = grads
    launch(launcher, *inputs, lse.contiguous(), *work, scale, causal_offset if causal else 0,
           deterministic, grid(launcher.spec, *inputs[:2], deterministic))
    if work is not grads:
        for grad, padded in zip(grads, work):
            grad.copy_(padded[..., :head_dim])
    return grads


def launch(launcher, q, k, v, out, dout, lse, dq, dk, dv, scale, causal_offset, deterministic,
           bwd_grid: schedule.BwdGrid) -> None:
    """Runs one compiled backward kernel on aligned (batch, seq, heads, dim) views, its grids as
    bwd_grid says (grid(); the tuner calls it too)."""
    batch, seqlen_q, heads, head_dim = q.shape
    rows = batch * heads * seqlen_q
    padded_head_dim = resources.padded_head_dim(head_dim)
    # The kernels' fp32 scratch in one allocation (one fewer torch.empty, 5 us of the host path
    # on an H100 host): dQ's workspace (none when deterministic), the split blocks' dK, dV and
    # counter (BwdTraits::kSplitFloats each), then D per query row. Freed on return, after the
    # launch: the caching allocator reuses it in stream order.
    dq_floats = 0 if deterministic else rows * padded_head_dim
    split_floats = bwd_grid.split_blocks * (2 * launcher.spec.block_n * padded_head_dim + 1)
    scratch = torch.empty(dq_floats + split_floats + rows, dtype=torch.float32, device=q.device)
    scratch_address = scratch.data_ptr()
    args = (launcher.address, launcher.error_string_address, q.data_ptr(), k.data_ptr(),
            v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(), dq.data_ptr(),
            dk.data_ptr(), dv.data_ptr(), scratch_address + 4 * (dq_floats + split_floats),
            0 if deterministic else scratch_address, scratch_address + 4 * dq_floats,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *dout.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
            batch, heads, k.shape[2], seqlen_q, k.shape[1], scale, scale * _LOG2_E, causal_offset,
            *bwd_grid)
    forward.call_on_device(loader.binding().bwd, q.get_device(), args)


def grid(spec, q, k, deterministic: bool) -> schedule.BwdGrid:
    """The grids of the backward kernel `spec` on (batch, seq, heads, dim) views q and k
    (schedule.py)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads // heads_kv
    sm_count, l2_bytes = _device_resources(q.get_device())
    key_blocks = -(-seqlen_k // spec.block_n)
    dq_bytes = group * seqlen_q * resources.padded_head_dim(head_dim) * 4
    sorted_tail_blocks = schedule.sorted_tail_blocks(spec.causal, key_blocks, batch * heads_kv,
                                                     dq_bytes, sm_count, l2_bytes)
    steps = group * -(-seqlen_q // spec.block_m)  # a key block's steps without causal masking
    split = schedule.split_tail(spec.causal, deterministic, key_blocks * batch * heads_kv, steps,
                                sm_count)
    return schedule.BwdGrid(sorted_tail_blocks, *split)


@functools.cache
def _device_resources(device_index: int) -> tuple[int, int]:
    """The device's SM count and L2 bytes."""
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, props.L2_cache_size


@functools.cache
def _choose(device_index: int, dtype: str, head_dim: int,
            causal: bool) -> tuple[loader.Launcher, int | None]:
    """The backward launcher for these calls and the head dim to zero-pad to (None: no padding).
    One kernel per head dim, whatever the shape (the forward picks a tile per shape). Cached: the
    first call decides, later ones pay one lookup."""
    arch = arch_for_capability(*torch.cuda.get_device_capability(device_index))
    choice = registry.main_choice(arch, dtype, head_dim, causal, "bwd")
    return loader.launcher(choice.spec), choice.padded_head_dim
