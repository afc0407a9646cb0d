# Where the backward's host time goes. (1) Per synchronised call at a real shape, as the grid
# times it: host entry -> first kernel start, the kernels' GPU span, and the kernel time in it,
# flashgen against FLASH_ATTENTION (torch.profiler, CPU + CUDA on one clock). (2) cProfile of
# flashgen's own backward function called directly (the autograd engine's thread is invisible to
# cProfile), tiny shape. argv: dtype, cells "head_dim:seqlen:causal(0|1)".
import cProfile
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from flashgen import bench, ops

dtype, cells = sys.argv[1], sys.argv[2:]
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

for cell in cells:
    hd, seqlen, causal = (int(x) for x in cell.split(":"))
    batch, heads = bench.grid_shape(seqlen, hd)
    inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
               for _ in range(3)]]
    for name in ("FLASH_ATTENTION", "flashgen"):
        with bench.backend(name):
            fn, sets, reset = bench.timed_call("bwd", bench.implementation(name, bool(causal)),
                                               inputs)
            for _ in range(3):
                reset(*sets[0]); fn(*sets[0]); torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    reset(*sets[0])
                    torch.cuda.synchronize()
                    with record_function("timed_call"):
                        fn(*sets[0])
                    torch.cuda.synchronize()
        events = prof.events()
        calls = sorted(e.time_range.start for e in events if e.name == "timed_call")
        kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        firsts, spans, busy = [], [], []
        for i, t0 in enumerate(calls):
            t_next = calls[i + 1] if i + 1 < len(calls) else float("inf")
            mine = [k for k in kernels if t0 <= k[0] < t_next]
            firsts.append(mine[0][0] - t0)
            spans.append(mine[-1][1] - mine[0][0])
            busy.append(sum(e - s for s, e in mine))
        med = lambda xs: sorted(xs)[len(xs) // 2]
        print(f"{name:16s} bwd {dtype} hd{hd} {'causal' if causal else 'full'} {seqlen}: host entry "
              f"-> first kernel {med(firsts):.1f} us, GPU span {med(spans):.1f} us, kernels "
              f"{med(busy):.1f} us (idle inside the span {med(spans) - med(busy):.1f} us)",
              flush=True)
    del inputs
    torch.cuda.empty_cache()

q, k, v = (torch.randn(1, 64, 1, 64, device="cuda", dtype=torch_dtype, requires_grad=True)
           for _ in range(3))
out, lse = ops.attention(q, k, v, 0.125, False, 0, False, False)
dout = torch.randn_like(out)
args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, 0.125, False, 0, False, False)
for _ in range(100):
    ops._bwd_cuda(*args)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(2000):
    ops._bwd_cuda(*args)
print(f"flashgen _bwd_cuda called directly: {(time.perf_counter() - start) / 2000 * 1e6:.1f} us "
      "per call")
torch.cuda.synchronize()
profiler = cProfile.Profile()
profiler.enable()
for _ in range(2000):
    ops._bwd_cuda(*args)
profiler.disable()
torch.cuda.synchronize()
pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
