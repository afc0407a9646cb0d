"""A packed training batch through flash_attn_varlen_func: one 8k document among 62 shorter ones
(200-1700 rows, 67,801 rows in all), head dim 128, 32 query and 8 KV heads, causal, bf16. Prints
forward + backward time (three medians of 20 event-timed calls) and the peak memory a call
allocates beyond its inputs (the backward's workspaces show there).

    python3 scripts/varlen_documents.py [--short-rows N] [--kernels]

--short-rows gives the 62 other documents N rows each (1: the cost of the grids' blocks past
them); --kernels adds each kernel's median time from the torch profiler (five calls).
"""

import argparse
import statistics

import torch

from flashgen import flash_attn_varlen_func
from flashgen.tools.bench.timing import time_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--short-rows", type=int)
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    lengths = [8192] + (torch.randint(200, 1700, (62,), generator=generator).tolist()
                        if args.short_rows is None else [args.short_rows] * 62)
    total, heads, heads_kv, head_dim = sum(lengths), 32, 8, 128
    q = torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k, v = (torch.randn(total, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    dout = torch.randn_like(q)

    def step():
        flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                               causal=True).backward(dout)

    step()
    torch.cuda.synchronize()
    inputs = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - inputs
    times = [time_ms(step, [()], repeats=20) for _ in range(3)]
    print(f"{len(lengths)} sequences, {total} rows, longest {max(lengths)}: forward + backward "
          + " ".join(f"{t:.3f}" for t in times) + f" ms, peak above inputs {peak / 2**30:.2f} GiB")
    if args.kernels:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        kernels = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(event.name[:70], []).append(event.device_time)
        for name, us in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
            print(f"    {statistics.median(us):9.1f} us x{len(us)}  {name}")


if __name__ == "__main__":
    main()
