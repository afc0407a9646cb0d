# Backward cells timed as FLASH_ATTENTION, flashgen without split blocks, flashgen with
# schedule.split_tail's choice, then the two flashgen grids again in the other order and
# FLASH_ATTENTION again (bench.time_ms: calls back to back, medians of event-timed calls).
# argv: dtype, cells "head_dim:seqlen:causal(0|1)".
import statistics
import sys

import torch

from flashgen import bench, schedule

production_split = schedule.split_tail


def no_split(*_):
    return 0, 1


dtype, cells = sys.argv[1], sys.argv[2:]
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
sm_count = torch.cuda.get_device_properties(0).multi_processor_count
gains = []
for cell in cells:
    hd, seqlen, causal = (int(x) for x in cell.split(":"))
    batch, heads = bench.grid_shape(seqlen, hd)
    sets = bench.input_sets(3 * batch * seqlen * heads * hd * 2,
                            torch.cuda.get_device_properties(0).L2_cache_size)
    inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(sets)]
    flops = bench.mode_flops("bwd", batch, heads, seqlen, seqlen, hd, bool(causal))
    tflops = lambda name: bench.measure(name, "bwd", bool(causal), inputs, flops)["tflops"]  # noqa: E731
    times = {"whole": [], "split": []}
    peer = [tflops("FLASH_ATTENTION")]
    for order in (("whole", "split"), ("split", "whole")):
        for name in order:
            schedule.split_tail = no_split if name == "whole" else production_split
            times[name].append(tflops("flashgen"))
    peer.append(tflops("FLASH_ATTENTION"))
    fa2 = statistics.mean(peer)
    whole, split = (statistics.mean(times[n]) for n in ("whole", "split"))
    schedule.split_tail = production_split
    choice = "-"
    if not causal:  # the choice backward.grid makes for this cell
        block_n = {64: 128, 128: 128, 256: 64}[hd]
        block_m = {64: 128, 128: 64, 256: 64}[hd]
        choice = production_split(False, False, -(-seqlen // block_n) * batch * heads,
                                  -(-seqlen // block_m), sm_count)
    gains.append(split / whole)
    print(f"bwd {dtype} hd{hd} {'causal' if causal else 'full':6s} {seqlen:6d} split {choice} | "
          f"FA2 {fa2:6.1f} ({peer[0]:.1f}, {peer[1]:.1f}) whole {whole / fa2:.3f} "
          f"({times['whole'][0] / fa2:.3f}, {times['whole'][1] / fa2:.3f}) split {split / fa2:.3f} "
          f"({times['split'][0] / fa2:.3f}, {times['split'][1] / fa2:.3f}) gain {split / whole - 1:+.1%}",
          flush=True)
    del inputs
    torch.cuda.empty_cache()
print(f"SUMMARY {dtype}: split / whole mean {statistics.mean(gains):.3f} min {min(gains):.3f} "
      f"max {max(gains):.3f}")
