"""One forward call per named implementation at one bench-grid cell, inside a profiler range, for
Nsight Compute (warm-up calls run outside the range, so only the measured calls are profiled):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        python3 scripts/ncu_forward.py --head-dim 128 --seqlen 512 --causal \\
        --impl flashgen --impl CUDNN_ATTENTION

The shape follows `flashgen bench` (16k tokens, heads x head dim = 2048); implementation names are
the bench's.
"""

import argparse

import torch

from flashgen.tools.bench import grid, timing

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
parser.add_argument("--head-dim", type=int, required=True)
parser.add_argument("--seqlen", type=int, required=True)
parser.add_argument("--causal", action="store_true")
parser.add_argument("--impl", action="append", required=True)
args = parser.parse_args()

dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
batch, heads = grid.grid_shape(args.seqlen, args.head_dim)
q, k, v = (torch.randn(batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=dtype)
           for _ in range(3))
for name in args.impl:
    with timing.backend(name):
        fn = timing.implementation(name, args.causal)
        for _ in range(3):
            fn(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"ncu_forward: {name} {args.dtype} hd{args.head_dim} seqlen {args.seqlen} "
          f"{'causal' if args.causal else 'full'} (batch {batch}, heads {heads})")
