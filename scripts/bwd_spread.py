"""How the backward's time spreads within one process: the same causal backward (bf16, batch 2,
8k, 16 heads, hd128 by default) timed in trials of three medians, a pad allocated before each
trial to move where the caching allocator places the backward's buffers, with the SM clock and
power read (nvidia-smi) after each trial.

    python3 scripts/bwd_spread.py [--reverse] [--head-dim 64]

--reverse allocates the pads in the opposite order: if the slow trials follow the trial index
(time since the start) they are the machine's, if they follow the pads, the buffers' placement.
"""

import argparse
import subprocess

import torch

from flashgen import flash_attn_func
from flashgen.tools.bench.timing import time_ms, timed_call

PADS_MB = [0, 1, 3, 7, 16, 40, 100, 2, 5, 64, 33, 200]


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reverse", action="store_true")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (2, 8192, 16, args.head_dim)
    inputs = [[torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]]
    call = lambda q, k, v: flash_attn_func(q, k, v, causal=True)
    pads = []
    for trial, mb in enumerate(PADS_MB[::-1] if args.reverse else PADS_MB):
        pads.append(torch.empty(mb * 2**20 + 4096 * trial, dtype=torch.uint8, device="cuda"))
        fn, sets, reset = timed_call("bwd", call, inputs)
        times = [time_ms(fn, sets, reset=reset, repeats=20) for _ in range(3)]
        print(f"trial {trial:2} pad {mb:3} MB  bwd ms {' '.join(f'{t:.3f}' for t in times)}  "
              f"[{clocks()}]", flush=True)


if __name__ == "__main__":
    main()
