"""The backward of flashgen, cuDNN and FlashAttention-4's SM90 path in one process: median
backward time per cell (three medians of 20 event-timed calls, `flashgen bench`'s method and
shape: 16k tokens, heads x head dim = 2048, bf16) and each implementation's kernels from the torch
profiler; with --ncu HD,CAUSAL,SEQLEN, one backward per implementation inside a profiler range
for Nsight Compute instead:

    python3 scripts/bwd_vs_fa4.py [--impl flashgen --impl FA4 ...] [--cell 128,0,8192 ...]
    ncu --profile-from-start off --set full -k regex:"bwd_kernel|BackwardSm90" \\
        python3 scripts/bwd_vs_fa4.py --ncu 128,1,8192 --impl flashgen

An A/B of two trees: build each into its own FLASHGEN_CACHE_DIR, then run this script from each
tree in turn (PYTHONPATH=<tree>), two rounds or more, with --tag naming the tree in every line.

FlashAttention-4 is imported from /tmp/site2: install its wheels there first (the device has no
network; ../shared/ANCHORS.md lists them and how to carry the large one in two halves).
"""

import argparse
import contextlib
import site
import statistics

import torch

from flashgen.tools.bench import grid
from flashgen.tools.bench.timing import backend, implementation, time_ms, timed_call

CELLS = [(128, True, 2048), (128, True, 8192), (128, False, 2048), (128, False, 8192),
         (64, False, 8192), (64, True, 8192), (64, False, 2048)]


def impl(name: str, causal: bool):
    if name == "FA4":
        site.addsitedir("/tmp/site2")
        from flash_attn.cute.interface import flash_attn_func as fa4_func

        return lambda q, k, v: fa4_func(q, k, v, causal=causal)[0]
    return implementation(name, causal)


def kernel_times(fn, sets, reset) -> dict:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            reset(*sets[0])
            fn(*sets[0])
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name[:70], []).append(event.device_time)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ncu", help="HD,CAUSAL(0|1),SEQLEN: one profiled backward per impl")
    parser.add_argument("--cell", action="append", help="HD,CAUSAL(0|1),SEQLEN: time these cells")
    parser.add_argument("--impl", action="append")
    parser.add_argument("--tag", default="", help="printed first on every timing line")
    args = parser.parse_args()
    names = args.impl or ["flashgen", "CUDNN_ATTENTION", "FA4"]

    def cell(text: str):
        hd, causal, seqlen = text.split(",")
        return int(hd), causal == "1", int(seqlen)

    cells = [cell(args.ncu)] if args.ncu else [cell(c) for c in args.cell or []] or CELLS
    for hd, causal, n in cells:
        b, h = grid.grid_shape(n, hd)
        inputs = [[torch.randn(b, n, h, hd, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3)] for _ in range(2)]
        flops = 4 * b * h * n * n * hd * 2.5 / (2 if causal else 1)
        for name in names:
            with contextlib.nullcontext() if name == "FA4" else backend(name):
                fn, sets, reset = timed_call("bwd", impl(name, causal), inputs)
                if args.ncu:
                    for _ in range(3):
                        reset(*sets[0])
                        fn(*sets[0])
                    torch.cuda.synchronize()
                    reset(*sets[0])
                    torch.cuda.profiler.start()
                    fn(*sets[0])
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                    continue
                ts = [time_ms(fn, sets, reset=reset, repeats=20) for _ in range(3)]
                kernels = kernel_times(fn, sets, reset)
            t = statistics.median(ts)
            print(f"{args.tag + ' ' if args.tag else ''}hd{hd} {'causal' if causal else 'full'} "
                  f"{n} {name:16} bwd ms "
                  f"{' '.join(f'{x:.3f}' for x in ts)}  {flops / t / 1e9:.0f} TFLOP/s", flush=True)
            for kernel, us in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
                print(f"    {statistics.median(us):9.1f} us x{len(us)}  {kernel}")


if __name__ == "__main__":
    main()
