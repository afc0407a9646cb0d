# The grid order (flashgen/schedule.py) swept in one process: for each causal cell, FLASH_ATTENTION,
# then flashgen with several ranks-per-round values, then FLASH_ATTENTION again (the peer is the
# mean of its two timings). argv: modes (fwd,bwd), head dims, seqlens, rounds ("old" = one round
# per (batch, head), the order before this session; a trailing "v" runs the forward's first
# variant tile), dtype, causal (1/0).
import statistics
import sys

import torch

from flashgen import bench, forward, schedule

modes, hds, seqlens, rounds = (sys.argv[i].split(",") for i in range(1, 5))
dtype = sys.argv[5] if len(sys.argv) > 5 else "bf16"
causal = (sys.argv[6] if len(sys.argv) > 6 else "1") == "1"
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
summary = {}
for mode in modes:
    for hd in map(int, hds):
        for seqlen in map(int, seqlens):
            batch, heads = bench.grid_shape(seqlen, hd)
            sets = bench.input_sets(3 * batch * seqlen * heads * hd * 2,
                                    torch.cuda.get_device_properties(0).L2_cache_size)
            inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
                       for _ in range(3)] for _ in range(sets)]
            flops = bench.mode_flops(mode, batch, heads, seqlen, seqlen, hd, causal)
            peer = [bench.measure("FLASH_ATTENTION", mode, causal, inputs, flops)["tflops"]]
            ours = {}
            for r in rounds:  # a trailing "v": the head dim's first forward variant tile
                variant = r.endswith("v")
                if variant and mode != "fwd":
                    continue
                schedule.CAUSAL_RANKS_PER_ROUND = 10**6 if r.rstrip("v") == "old" else int(r.rstrip("v"))
                forward._choose.cache_clear()
                name = "flashgen_variant_tile" if variant else "flashgen"
                ours[r] = bench.measure(name, mode, causal, inputs, flops)["tflops"]
            peer.append(bench.measure("FLASH_ATTENTION", mode, causal, inputs, flops)["tflops"])
            fa2 = statistics.mean(peer)
            line = "  ".join(f"{r}:{t / fa2:.3f}" for r, t in ours.items())
            print(f"{mode} {dtype} hd{hd} {'causal' if causal else 'full'} {seqlen:6d} FA2 {fa2:6.1f} "
                  f"({peer[0]:.1f}/{peer[1]:.1f})  {line}", flush=True)
            for r, t in ours.items():
                summary.setdefault((mode, r), []).append(t / fa2)
            del inputs
            torch.cuda.empty_cache()
for (mode, r), ratios in summary.items():
    print(f"SUMMARY {mode} rounds={r}: mean {statistics.mean(ratios):.3f} "
          f"median {statistics.median(ratios):.3f} min {min(ratios):.3f}")
