# Where a backward's time goes, kernel by kernel: flashgen and FLASH_ATTENTION on the same inputs,
# torch.profiler's CUDA time per kernel, averaged over the timed calls. argv: dtype, then cells
# "head_dim:seqlen:causal(0|1)".
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from flashgen import bench

CALLS = 10
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
                reset(*sets[0])
                fn(*sets[0])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(CALLS):
                    reset(*sets[0])
                    fn(*sets[0])
                torch.cuda.synchronize()
        per_kernel = collections.defaultdict(float)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[event.name[:70]] += event.device_time / CALLS  # us
        total = sum(per_kernel.values())
        print(f"{name} bwd {dtype} hd{hd} {'causal' if causal else 'full'} {seqlen}: "
              f"{total:.1f} us of kernels per call")
        for kernel, us in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
            print(f"    {us:9.1f} us {100 * us / total:5.1f}%  {kernel}")
    del inputs
    torch.cuda.empty_cache()
