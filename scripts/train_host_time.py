"""Host time of one training call (forward with autograd + backward) against its GPU time: a
call whose host work outlasts its kernels is host-bound, and its fwd_bwd bench time then reads the
host's time and jitter instead of the kernels'.

For causal and sliding-window 1024 attention (bf16, batch 2, seqlen 8k, 16 heads) at each head
dim: three medians of CUDA-event-timed fwd_bwd calls (bench's timing), then the host's time per
call, issued while a spin kernel keeps the GPU busy so that no call waits on the GPU.

    python3 scripts/train_host_time.py [--head-dim 128 --head-dim 64] [--tag new]
"""

import argparse
import time

import torch

from flashgen import flash_attn_func
from flashgen.tools.bench.timing import time_ms, timed_call

CASES = {"window": dict(causal=True, window_size=(1024, 0)), "causal": dict(causal=True)}


def host_ms_per_call(fn, sets, reset, calls=20):
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # ~50 ms of GPU spin: longer than the calls' host work
    start = time.perf_counter()
    for _ in range(calls):
        reset(*sets[0])
        fn(*sets[0])
    host = (time.perf_counter() - start) / calls * 1000
    torch.cuda.synchronize()
    return host


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, action="append")
    parser.add_argument("--tag", default="", help="a label printed first on every line")
    args = parser.parse_args()
    torch.manual_seed(0)
    for head_dim in args.head_dim or [128, 64]:
        inputs = [[torch.randn(2, 8192, 16, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3)]]
        for name, kwargs in CASES.items():
            fn, sets, reset = timed_call(
                "fwd_bwd", lambda q, k, v: flash_attn_func(q, k, v, **kwargs), inputs)
            medians = [time_ms(fn, sets, reset=reset) for _ in range(3)]
            print(f"{args.tag} hd{head_dim} {name:6} fwd_bwd ms "
                  f"{' '.join(f'{m:.3f}' for m in medians)}  "
                  f"host/call {host_ms_per_call(fn, sets, reset):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
