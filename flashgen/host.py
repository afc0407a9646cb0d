"""Host-side helpers that every pass and family shares around its kernels' launches: the device
and stream a launch runs on, the device's resources, the params' problem sizes, output
allocation, and the one alignment policy for inputs."""

from __future__ import annotations

import functools
import operator
import sys

import torch

# The current stream's handle as an int, as inductor's generated code gets it (CUDA builds of
# torch only; launches see CUDA tensors only): torch.cuda.current_stream(device).cuda_stream
# builds a Stream object first, 6 us of a 44 us call on an H100 host.
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.cuda.current_device() without its lazy-initialisation check, which the tensors' existence
# makes moot (0.4 us per call on a CPU). Not cached: torch.cuda.set_device may change it any time.
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_warned_copy = False
# Whether the current stream is capturing a CUDA graph (CUDA builds of torch only).
stream_capturing = torch.cuda.is_current_stream_capturing


_PLAIN = (int, float, bool, str, type(None))
# The types of a common call's arguments, keyed without a loop over the values that are no tensor.
_COMMON = frozenset((torch.Tensor, int, float, bool, type(None), tuple))
_PLAIN_TYPES = frozenset(_PLAIN)


class Signature:
    """A call's arguments as the key of what their checks decided: at the tensor positions each
    tensor's type, device, dtype, shape, strides and requires_grad; elsewhere, and for what is no
    tensor there, each value with its type (True and 1 differ to the checks) where it is a number,
    string, None or a tuple of those. None (no key) for any other value, a tensor where a number
    goes among them: the checks read its value."""

    def __init__(self, tensor_positions: tuple, arguments: int):
        self.tensor_positions = frozenset(tensor_positions)
        self._tensors = tuple(tensor_positions)
        self._others = operator.itemgetter(
            *(i for i in range(arguments) if i not in self.tensor_positions))

    def __call__(self, values: tuple):
        types = tuple(map(type, values))
        others = self._others(types)
        if not _COMMON.issuperset(types) or torch.Tensor in others:
            return self._general(values)
        plain = self._others(values)
        key = [types, plain]
        if tuple in others:  # window_size: its values' types too
            for kind, value in zip(others, plain):
                if kind is tuple:
                    inner = tuple(map(type, value))
                    if not _PLAIN_TYPES.issuperset(inner):
                        return self._general(values)
                    key.append(inner)
        for i in self._tensors:
            t = values[i]
            if t is not None:
                if types[i] is not torch.Tensor:
                    return self._general(values)
                key.append((t.device, t.dtype, t.shape, t.stride(), t.requires_grad))
        return tuple(key)

    def _general(self, values: tuple):
        key = []
        for position, value in enumerate(values):
            if isinstance(value, torch.Tensor) and position in self.tensor_positions:
                key.append((type(value), value.device, value.dtype, value.shape, value.stride(),
                            value.requires_grad))
            elif type(value) in _PLAIN:
                key.append((type(value), value))
            elif type(value) is tuple and all(type(v) in _PLAIN for v in value):
                key.append(tuple((type(v), v) for v in value))
            else:
                return None
        return ("general", *key)


def problem_sizes(q, k, varlen: tuple = ()) -> tuple[int, int, int, dict]:
    """(batch, seqlen_q, seqlen_k, the params' cu_seqlens fields) of a call on (batch, seq,
    heads, dim) views; varlen: a variable-length batch's (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k), its views packed as (1, total, heads, dim)."""
    if not varlen:
        return q.shape[0], q.shape[1], k.shape[1], {}
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen
    return (cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k,
            {"cu_seqlens_q": cu_seqlens_q.data_ptr(), "cu_seqlens_k": cu_seqlens_k.data_ptr()})


@functools.cache
def device_resources(device_index: int) -> tuple[int, int]:
    """The device's SM count and L2 bytes."""
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, props.L2_cache_size


def call_on_device(entry, device_index: int, args: tuple) -> None:
    """entry(*args, stream): a binding function that launches kernels, on the tensors' device
    and that device's current stream."""
    stream = _current_stream(device_index)
    if device_index == _current_device():
        entry(*args, stream)
    else:  # kernels launch on the current device: switch to the tensors' one
        with torch.cuda.device(device_index):
            entry(*args, stream)


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


def is_aligned(t: torch.Tensor, tma: bool = False) -> bool:
    """16-byte loads need the base address and every stride of a (batch, seq, heads, dim) view
    at a multiple of 8 (2-byte) elements. tma: the kernels read the tensor through a TMA
    descriptor, whose strides must be nonzero too (an expanded view has zero strides)."""
    batch_stride, row_stride, head_stride, _ = t.stride()
    # Strides are never negative, so the or has a low bit set iff one of them has.
    return (t.data_ptr() % 16 == 0 and (batch_stride | row_stride | head_stride) % 8 == 0
            and not (tma and 0 in (batch_stride, row_stride, head_stride)))


def aligned(*tensors, tma: bool = False):
    """The tensors, each copied to a contiguous one if is_aligned refuses it (exact; a one-time
    notice says so, since the copy costs memory traffic)."""
    if all(is_aligned(t, tma) for t in tensors):
        return tensors
    global _warned_copy
    if not _warned_copy:
        print("flashgen: an input's address or strides are not multiples of 16 bytes, or (for "
              "kernels that load by TMA) a stride is 0; copying it (pass contiguous tensors to "
              "avoid the copy)", file=sys.stderr)
        _warned_copy = True
    return tuple(t if is_aligned(t, tma) else t.clone(memory_format=torch.contiguous_format)
                 for t in tensors)


def padded(tensors, head_dim: int):
    """The tensors zero-padded along the head dim to head_dim (exact: zeros add nothing to q.k,
    and the padded output columns are dropped)."""
    import torch.nn.functional as F

    return tuple(F.pad(t, (0, head_dim - t.shape[-1])) for t in tensors)
