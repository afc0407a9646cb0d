"""Host time per tiny call, flashgen against FlashAttention-2 through SDPA (bench --overhead)."""

from __future__ import annotations

import statistics

from flashgen.tools.bench.grid import PEER
from flashgen.tools.bench.timing import backend, implementation, timed_call


def overhead_us(calls: int = 2000) -> dict:
    """Host time per tiny call (batch 1, 1 head, seqlen 64, head dim 64), CPU-bound: flashgen
    against SDPA's FLASH_ATTENTION backend, the forward without grad and the backward (autograd
    included, as the grid times it). Microseconds per call, median of 5 rounds."""
    import time

    import torch

    inputs = [[torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]]

    def per_call(fn, reset=None):
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                if reset is not None:
                    reset()
                fn()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(rounds)

    result = {}
    for mode in ("fwd", "bwd"):
        for name in ("flashgen", PEER):
            with backend(name):
                fn, sets, reset = timed_call(mode, implementation(name, causal=False), inputs)
                result[f"{name}_{mode}_us"] = per_call(
                    lambda: fn(*sets[0]), reset and (lambda: reset(*sets[0])))
        result[f"{mode}_ratio"] = result[f"flashgen_{mode}_us"] / result[f"{PEER}_{mode}_us"]
    return result
