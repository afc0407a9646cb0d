"""NaN for every uninitialised floating-point tensor: what the GPU tests' poisoned_allocations
fixture installs, and what tests/test_poison_cpu.py proves reaches every output of the public
functions."""

from __future__ import annotations

import torch

# Every allocator that hands out uninitialised memory, as (owner, name): torch's functions and
# the Tensor methods that allocate like their tensor. torch.zeros and friends are left alone:
# zeroed buffers are a legitimate choice.
ALLOCATORS = tuple((torch, name) for name in ("empty", "empty_like", "empty_strided",
                                              "empty_permuted")) + tuple(
    (torch.Tensor, name) for name in ("new_empty", "new_empty_strided"))


def poisoning(allocate):
    """allocate, with every floating-point tensor it returns filled with NaN."""
    def poisoned(*args, **kwargs):
        t = allocate(*args, **kwargs)
        if t.is_floating_point():
            with torch.no_grad():  # a leaf that requires grad takes no in-place fill otherwise
                t.fill_(float("nan"))
        return t
    poisoned.__wrapped__ = allocate
    return poisoned


def poison_allocations(monkeypatch) -> None:
    """Until monkeypatch undoes it, every allocator in ALLOCATORS poisons what it makes, and so
    does the compiled replay of known calls (flashgen/replay.py), which allocates in C++."""
    for owner, name in ALLOCATORS:
        monkeypatch.setattr(owner, name, poisoning(getattr(owner, name)))
    monkeypatch.setenv("FLASHGEN_POISON_OUTPUTS", "1")
