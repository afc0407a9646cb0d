# Two checks of where a backward's wall time goes beyond its kernels, flashgen against
# FLASH_ATTENTION: (1) host time per backward on a tiny shape (CPU-bound loop, as
# bench.overhead_us does for the forward); (2) per cell, the event-timed median (bench.time_ms,
# one synchronised call per sample, as the grid times) against the sum of the call's kernels
# (torch.profiler). argv: dtype, then cells "head_dim:seqlen:causal(0|1)".
import collections
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashgen import bench

dtype, cells = sys.argv[1], sys.argv[2:]
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
NAMES = ("FLASH_ATTENTION", "flashgen")


def tiny_backward_us(name, calls=2000):
    inputs = [[torch.randn(1, 64, 1, 64, device="cuda", dtype=torch_dtype) for _ in range(3)]]
    with bench.backend(name):
        fn, sets, reset = bench.timed_call("bwd", bench.implementation(name, False), inputs)
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                reset(*sets[0])
                fn(*sets[0])
            rounds.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return statistics.median(rounds)


for name in NAMES:
    print(f"tiny backward host time {name}: {tiny_backward_us(name):.1f} us per call")

for cell in cells:
    hd, seqlen, causal = (int(x) for x in cell.split(":"))
    batch, heads = bench.grid_shape(seqlen, hd)
    inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
               for _ in range(3)]]
    for name in NAMES:
        with bench.backend(name):
            fn, sets, reset = bench.timed_call("bwd", bench.implementation(name, bool(causal)),
                                               inputs)
            event_ms = bench.time_ms(fn, sets, reset=reset)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    reset(*sets[0])
                    fn(*sets[0])
                    torch.cuda.synchronize()
            event_ms_after = bench.time_ms(fn, sets, reset=reset)
        kernels = collections.defaultdict(float)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name[:40]] += event.device_time / 10 / 1000  # ms per call
        total = sum(kernels.values())
        print(f"{name:16s} bwd {dtype} hd{hd} {'causal' if causal else 'full'} {seqlen}: events "
              f"{event_ms:.3f} / {event_ms_after:.3f} ms, kernels {total:.3f} ms "
              f"({', '.join(f'{k[:28]} {v:.3f}' for k, v in kernels.items())})", flush=True)
    del inputs
    torch.cuda.empty_cache()
