# Backward cells of one tree, each timed as FLASH_ATTENTION, flashgen, FLASH_ATTENTION (the peer is
# the mean of its two timings). argv: dtype, then cells "head_dim:seqlen:causal(0|1)".
import statistics
import sys

import torch

from flashgen import bench

dtype, cells = sys.argv[1], sys.argv[2:]
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
ratios = []
for cell in cells:
    hd, seqlen, causal = (int(x) for x in cell.split(":"))
    batch, heads = bench.grid_shape(seqlen, hd)
    sets = bench.input_sets(3 * batch * seqlen * heads * hd * 2,
                            torch.cuda.get_device_properties(0).L2_cache_size)
    inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(sets)]
    flops = bench.mode_flops("bwd", batch, heads, seqlen, seqlen, hd, bool(causal))
    peer = [bench.measure("FLASH_ATTENTION", "bwd", bool(causal), inputs, flops)["tflops"]]
    ours = bench.measure("flashgen", "bwd", bool(causal), inputs, flops)["tflops"]
    peer.append(bench.measure("FLASH_ATTENTION", "bwd", bool(causal), inputs, flops)["tflops"])
    fa2 = statistics.mean(peer)
    ratios.append(ours / fa2)
    print(f"bwd {dtype} hd{hd} {'causal' if causal else 'full':6s} {seqlen:6d} FA2 {fa2:6.1f} "
          f"({peer[0]:.1f}/{peer[1]:.1f}) flashgen {ours:6.1f} ratio {ours / fa2:.3f}", flush=True)
    del inputs
    torch.cuda.empty_cache()
print(f"SUMMARY mean {statistics.mean(ratios):.3f} median {statistics.median(ratios):.3f} "
      f"min {min(ratios):.3f}")
