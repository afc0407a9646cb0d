"""Wall time of the first call of kernels nobody built: what a user trying a new head dim, mask
or dtype waits for (bench/results/build/).

    FLASHGEN_CACHE_DIR=<empty folder> python3 -m flashgen.tools.bench.first_call [--head-dim 96]

In one process: a call of a head dim 128 causal forward first (built if need be, not timed: the
binding, CUDA and torch start there), then, each timed from the call to a synchronize, on
kernels of `--head-dim` with a window that the cache must not hold: a forward alone (fp16), a
backward whose forward is built (fp16), a training step whose forward and backward both compile
(bf16, one build: flashgen.loader.gradients_wanted). Prints one JSON object: seconds per call,
the cores, and whether the builds split each kernel's device and launch code
(codegen.build.split_build).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _timed(fn) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 1)


def first_calls(head_dim: int, window: int = 128) -> dict:
    import torch

    import flashgen
    from codegen import build

    def inputs(dim, dtype, grad=False):
        return [torch.randn(2, 512, 8, dim, device="cuda", dtype=dtype, requires_grad=grad)
                for _ in range(3)]

    windowed = {"window_size": (window, window)}
    warm = _timed(lambda: flashgen.flash_attn_func(*inputs(128, torch.bfloat16), causal=True))

    def forward_alone():
        flashgen.flash_attn_func(*inputs(head_dim, torch.float16), **windowed)

    def backward_alone():
        q, k, v = inputs(head_dim, torch.float16, grad=True)
        flashgen.flash_attn_func(q, k, v, **windowed).sum().backward()

    def training_step():
        q, k, v = inputs(head_dim, torch.bfloat16, grad=True)
        flashgen.flash_attn_func(q, k, v, **windowed).sum().backward()

    cores = os.cpu_count() or 1
    return {"head_dim": head_dim, "window": window, "cores": cores,
            "split": {"one kernel": build.split_build(1, cores),
                      "two kernels": build.split_build(2, cores)},
            "warm_call_s": warm, "forward_alone_s": _timed(forward_alone),
            "backward_alone_s": _timed(backward_alone),
            "training_step_s": _timed(training_step)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, default=96)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args(argv)
    print(json.dumps(first_calls(args.head_dim, args.window)))


if __name__ == "__main__":
    main()
