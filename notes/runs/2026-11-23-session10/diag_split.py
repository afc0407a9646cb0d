# Why call C's hd128 4k split measurements were sometimes 5-10% slow: flashgen's backward timed
# as bench.time_ms does (30 calls back to back after 5 warm-up calls), alternately whole and
# split, under the profiler: per measurement the median, min and max call, the device
# allocations made while timing, and each kernel's mean duration.
# argv: dtype head_dim seqlen.
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from flashgen import bench, schedule

production_split = schedule.split_tail
dtype, hd, seqlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
batch, heads = bench.grid_shape(seqlen, hd)
sets = bench.input_sets(3 * batch * seqlen * heads * hd * 2,
                        torch.cuda.get_device_properties(0).L2_cache_size)
inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
           for _ in range(3)] for _ in range(sets)]
fn, call_sets, reset = bench.timed_call("bwd", bench.implementation("flashgen", False), inputs)


def measure(name, warmup=5, calls=30):
    schedule.split_tail = (lambda *_: (0, 1)) if name == "whole" else production_split
    for i in range(warmup):
        reset(*call_sets[i % len(call_sets)])
        fn(*call_sets[i % len(call_sets)])
    torch.cuda.synchronize()
    allocs = torch.cuda.memory_stats().get("num_device_alloc", -1)
    events = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            args = call_sets[i % len(call_sets)]
            reset(*args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
    allocs = torch.cuda.memory_stats().get("num_device_alloc", -1) - allocs
    times = [s.elapsed_time(e) for s, e in events]
    kernels = []
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", 0) or getattr(evt, "cuda_time_total", 0)
        if total > 0 and evt.count:
            kernels.append((total, f"{evt.key[:40]} x{evt.count} {total / evt.count:.0f}us"))
    kernels = "; ".join(text for _, text in sorted(kernels, reverse=True)[:5])
    print(f"{dtype} hd{hd} {seqlen} {name:5s} median {statistics.median(times):.3f} ms min "
          f"{min(times):.3f} max {max(times):.3f} device allocs {allocs} | {kernels}", flush=True)


for trial in range(3):
    for name in ("whole", "split", "split", "whole"):
        measure(name)
