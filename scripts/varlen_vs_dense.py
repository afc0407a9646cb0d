"""flash_attn_varlen_func on a batch of equal lengths against flash_attn_func on the same rows,
forward and forward + backward, in one process (the issue's "within 3%" check).

    python3 scripts/varlen_vs_dense.py [--family mma] [--varlen-only]

--family pins both functions' forward to one family (unset: dispatch's choice, the hopper family
on an H100). --varlen-only times flash_attn_varlen_func alone, forward + backward three times: to
compare two trees' varlen paths where one lacks the dense kernels."""

import argparse
import os

import torch

from flashgen import flash_attn_func, flash_attn_varlen_func, forward
from flashgen.tools.bench.timing import time_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family")
    parser.add_argument("--varlen-only", action="store_true")
    args = parser.parse_args()
    if args.family:
        os.environ["FLASHGEN_FAMILY"] = args.family
        forward.clear_plans()
    for head_dim, causal in ((64, False), (128, False), (128, True)):
        batch, seqlen, heads = 8, 2048, 2048 // head_dim
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                               dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        packed = [t.detach().reshape(-1, heads, head_dim).requires_grad_() for t in (q, k, v)]
        cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device="cuda")
        dense = lambda: flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        varlen = lambda: flash_attn_varlen_func(*packed, cu, cu, seqlen, seqlen,  # noqa: E731
                                                causal=causal)
        dout = torch.randn(batch * seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        row = [f"hd{head_dim} {'causal' if causal else 'full'}"]
        if args.varlen_only:
            with torch.no_grad():
                row.append(f"varlen fwd {time_ms(varlen, [()], repeats=30):.3f} ms fwd_bwd")
            row += [f"{time_ms(lambda: varlen().backward(dout), [()], repeats=30):.3f}"
                    for _ in range(3)]
            print(" ".join(row) + " ms", flush=True)
            continue
        for mode in ("fwd", "fwd_bwd"):
            times = []
            for fn in (dense, varlen):
                if mode == "fwd":
                    with torch.no_grad():
                        times.append(time_ms(fn, [()], repeats=30))
                else:
                    times.append(time_ms(lambda: fn().reshape(dout.shape).backward(dout), [()],
                                         repeats=30))
            row.append(f"{mode}: dense {times[0]:.3f} ms varlen {times[1]:.3f} ms "
                       f"(varlen/dense {times[1] / times[0]:.3f})")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
