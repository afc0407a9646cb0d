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
    launch(launcher, *inputs, lse.contiguous(), *work, scale,
           causal_offset if causal else 0, deterministic, grid_order(launcher.spec, *inputs[:2]))
    if work is not grads:
        for grad, padded in zip(grads, work):
            grad.copy_(padded[..., :head_dim])
    return grads


def launch(launcher, q, k, v, out, dout, lse, dq, dk, dv, scale, causal_offset, deterministic,
           sorted_tail_blocks) -> None:
    """Runs one compiled backward kernel on aligned (batch, seq, heads, dim) views, its grids in
    the order sorted_tail_blocks gives (grid_order; the tuner calls it too)."""
    batch, seqlen_q, heads, head_dim = q.shape
    rows = batch * heads * seqlen_q
    # The kernels' fp32 scratch in one allocation (one fewer torch.empty, 5 us of the host path
    # on an H100 host): dQ's workspace (none when deterministic), then D per query row. Freed on
    # return, after the launch: the caching allocator reuses it in stream order.
    dq_floats = 0 if deterministic else rows * resources.padded_head_dim(head_dim)
    scratch = torch.empty(dq_floats + rows, dtype=torch.float32, device=q.device)
    scratch_address = scratch.data_ptr()
    args = (launcher.address, launcher.error_string_address, q.data_ptr(), k.data_ptr(),
            v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(), dq.data_ptr(),
            dk.data_ptr(), dv.data_ptr(), scratch_address + 4 * dq_floats,
            0 if deterministic else scratch_address,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *dout.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
            batch, heads, k.shape[2], seqlen_q, k.shape[1], scale, scale * _LOG2_E, causal_offset,
            sorted_tail_blocks)
    forward.call_on_device(loader.binding().bwd, q.get_device(), args)


def grid_order(spec, q, k) -> int:
    """BwdParams.sorted_tail_blocks for the backward kernel `spec` on (batch, seq, heads, dim)
    views q and k (schedule.py)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    sm_count, l2_bytes = _device_resources(q.get_device())
    dq_bytes = heads // heads_kv * seqlen_q * resources.padded_head_dim(head_dim) * 4
    return schedule.sorted_tail_blocks(spec.causal, -(-seqlen_k // spec.block_n),
                                       batch * heads_kv, dq_bytes, sm_count, l2_bytes)


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
