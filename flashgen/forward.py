"""The forward pass on (batch, seq, heads, dim) views: out and the log-sum-exp of each query row,
from one compiled kernel: the head dim's main tile or, where the call's shape leaves SMs idle, one
of its variants (tile_choice.py)."""

from __future__ import annotations

import contextlib
import functools
import math
import sys

import torch
import torch.nn.functional as F

from codegen.arch import arch_for_capability
from codegen.spec import KernelSpec, forward_candidates
from flashgen import loader, registry, schedule, tile_choice, validate

_LOG2_E = math.log2(math.e)
# The current stream's handle as an int, as inductor's generated code gets it (CUDA builds of
# torch only; launch() sees CUDA tensors only): torch.cuda.current_stream(device).cuda_stream
# builds a Stream object first, 6 us of a 44 us call on an H100 host.
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.cuda.current_device() without its lazy-initialisation check, which the tensors' existence
# makes moot (0.4 us per call on a CPU). Not cached: torch.cuda.set_device may change it any time.
_current_device = getattr(torch._C, "_cuda_getDevice", None)
# None: tile_choice picks each call's tile by shape; an index forces that candidate (forced_tile).
_forced_tile: int | None = None
_warned_copy = False


def forward(q, k, v, dtype: str, scale: float, causal: bool, causal_offset: int,
            heads_first: bool):
    """out (q's shape and dtype, laid out by empty_output) and lse (batch, heads, seqlen_q) fp32.

    q, k, v: validated (batch, seq, heads, dim) views of one fp16/bf16 dtype (`dtype` is its short
    name). Key j is visible to query i iff j <= i + causal_offset when causal.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    device = q.device
    launcher, padded_head_dim, ranks_per_round = _choose(device.index, dtype, head_dim, causal,
                                                         batch * heads, seqlen_q, _forced_tile)

    out, lse = empty_outputs(q, heads_first)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:  # no key at all: every row sees nothing
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse

    if padded_head_dim is not None:
        pad = (0, padded_head_dim - head_dim)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        o = torch.empty((batch, seqlen_q, heads, padded_head_dim), dtype=q.dtype, device=device)
    else:  # out is freshly allocated, so aligned; the inputs may be any views
        if not (validate.is_aligned(q) and validate.is_aligned(k) and validate.is_aligned(v)):
            q, k, v = (t if validate.is_aligned(t) else _aligned_copy(t) for t in (q, k, v))
        o = out

    launch(launcher, q, k, v, o, lse, scale, causal_offset if causal else 0, ranks_per_round)
    if o is not out:
        out.copy_(o[..., :head_dim])
    return out, lse


def empty_outputs(q: torch.Tensor, heads_first: bool):
    """The forward's uninitialised out and lse for q; the fake (meta) implementation of the
    flashgen::fwd op calls this too, so both always agree on shapes and strides."""
    batch, seqlen_q, heads, _ = q.shape
    # Sizes as separate ints: 0.8 us faster per call than a tuple (torch 2.13, CPU).
    return empty_output(q, heads_first), q.new_empty(batch, heads, seqlen_q, dtype=torch.float32)


def empty_output(like: torch.Tensor, heads_first: bool):
    """An uninitialised tensor with like's (batch, seq, heads, dim) shape, dtype and device;
    heads_first lays it out in memory as (batch, heads, seq, dim), SDPA's layout. Never a view:
    autograd refuses every in-place change of a view created inside a custom op, where PyTorch's
    own SDPA output allows one."""
    if heads_first:
        return torch.empty_permuted(like.shape, (0, 2, 1, 3), dtype=like.dtype,
                                    device=like.device)
    # 1.6 us faster than torch.empty(like.shape, dtype=..., device=...) (torch 2.13, CPU)
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def launch(launcher: loader.Launcher, q, k, v, o, lse, scale: float, causal_offset: int,
           ranks_per_round: int) -> None:
    """Runs one compiled kernel on validated (batch, seq, heads, dim) views, on the tensors'
    device and its current stream, its grid in the order ranks_per_round gives (schedule.py)."""
    batch, seqlen_q, heads, _ = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    q_strides, k_strides, v_strides, o_strides = q.stride(), k.stride(), v.stride(), o.stride()
    args = (launcher.address, launcher.error_string_address, q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(),
            q_strides[0], q_strides[1], q_strides[2], k_strides[0], k_strides[1], k_strides[2],
            v_strides[0], v_strides[1], v_strides[2], o_strides[0], o_strides[1], o_strides[2],
            batch, heads, heads_kv, seqlen_q, seqlen_k, scale, scale * _LOG2_E, causal_offset,
            ranks_per_round)
    call_on_device(loader.binding().fwd, q.get_device(), args)


def call_on_device(entry, device_index: int, args: tuple) -> None:
    """entry(*args, stream): a binding function that launches kernels, on the tensors' device
    and that device's current stream."""
    stream = _current_stream(device_index)
    if device_index == _current_device():
        entry(*args, stream)
    else:  # kernels launch on the current device: switch to the tensors' one
        with torch.cuda.device(device_index):
            entry(*args, stream)


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    global _warned_copy
    if not _warned_copy:
        print("flashgen: an input's address or strides are not multiples of 16 bytes; copying "
              "it (pass contiguous tensors to avoid the copy)", file=sys.stderr)
        _warned_copy = True
    return t.clone(memory_format=torch.contiguous_format)


def kernel_for(device: torch.device, dtype: str, head_dim: int, causal: bool, batch_heads: int,
               seqlen_q: int) -> KernelSpec:
    """The forward kernel a call of this shape runs (the bench reports its tile)."""
    launcher, _, _ = _choose(device.index, dtype, head_dim, causal, batch_heads, seqlen_q,
                             _forced_tile)
    return launcher.spec


@contextlib.contextmanager
def forced_tile(index: int):
    """Inside, every forward call runs candidate `index` of its head dim (0: the main tile, 1: the
    first variant) whatever its shape: the bench's flashgen_main_tile and flashgen_variant_tile."""
    global _forced_tile
    previous, _forced_tile = _forced_tile, index
    try:
        yield
    finally:
        _forced_tile = previous


@functools.lru_cache(maxsize=4096)
def _choose(device_index: int, dtype: str, head_dim: int, causal: bool, batch_heads: int,
            seqlen_q: int, forced: int | None) -> tuple[loader.Launcher, int | None, int]:
    """The launcher for a call of this shape, the head dim to zero-pad to (None: no padding) and
    its grid's ranks per round (schedule.py). Cached: the first call of a shape decides, later
    ones pay one lookup."""
    candidates, padded_head_dim, sm_count = _candidates(device_index, dtype, head_dim, causal)
    if forced is None:
        tile = tile_choice.choose_tile([s.tile for s in candidates], batch_heads, seqlen_q,
                                       sm_count)
        spec = next(s for s in candidates if s.tile == tile)
    elif forced < len(candidates):
        spec = candidates[forced]
    else:
        raise NotImplementedError(f"flashgen: head dim {head_dim} has {len(candidates)} forward "
                                  f"tile(s); tile {forced} was forced")
    return loader.launcher(spec), padded_head_dim, schedule.for_spec(spec, seqlen_q)


@functools.cache
def _candidates(device_index: int, dtype: str, head_dim: int, causal: bool):
    """The forward specs that can run these calls on this device (the main tile's first), the head
    dim to zero-pad to (None: no padding) and the device's SM count."""
    props = torch.cuda.get_device_properties(device_index)
    choice = registry.main_choice(arch_for_capability(props.major, props.minor), dtype, head_dim,
                                  causal, "fwd")
    return (forward_candidates(registry.active_config(), choice.spec), choice.padded_head_dim,
            props.multi_processor_count)
