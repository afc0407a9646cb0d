# Backward cells timed as FLASH_ATTENTION, flashgen with (batch, head)-major grids (tail 0),
# flashgen with the sorted tail (schedule.py's choice), FLASH_ATTENTION again; each both ways:
# "async" = bench.time_ms (calls back to back, the committed method since session 9) and
# "sync" = each call synchronised before the next (the method up to session 8: the host's
# latency before the first kernel counts). argv: dtype, cells "head_dim:seqlen:causal(0|1)".
import statistics
import sys

import torch

from flashgen import backward, bench, schedule

async_time_ms = bench.time_ms
production_tail = schedule.sorted_tail_blocks


def sync_time_ms(fn, inputs, warmup=5, repeats=30, reset=None):
    times = []
    for i in range(warmup + repeats):
        args = inputs[i % len(inputs)]
        if reset is not None:
            reset(*args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def use_tail(sorted_tail):
    schedule.sorted_tail_blocks = sorted_tail
    backward._choose.cache_clear()


dtype, cells = sys.argv[1], sys.argv[2:]
torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
summary = {}
for cell in cells:
    hd, seqlen, causal = (int(x) for x in cell.split(":"))
    batch, heads = bench.grid_shape(seqlen, hd)
    sets = bench.input_sets(3 * batch * seqlen * heads * hd * 2,
                            torch.cuda.get_device_properties(0).L2_cache_size)
    inputs = [[torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(sets)]
    flops = bench.mode_flops("bwd", batch, heads, seqlen, seqlen, hd, bool(causal))
    line = []
    for method, timer in (("async", async_time_ms), ("sync", sync_time_ms)):
        bench.time_ms = timer
        tflops = lambda name: bench.measure(name, "bwd", bool(causal), inputs, flops)["tflops"]  # noqa: E731
        peer = [tflops("FLASH_ATTENTION")]
        use_tail(lambda causal, sm_count: 0)
        major = tflops("flashgen")
        use_tail(production_tail)
        tail = tflops("flashgen")
        peer.append(tflops("FLASH_ATTENTION"))
        fa2 = statistics.mean(peer)
        for name, value in (("major", major), ("tail", tail)):
            summary.setdefault((method, name), []).append(value / fa2)
        line.append(f"{method}: FA2 {fa2:6.1f} major {major / fa2:.3f} tail {tail / fa2:.3f}")
    print(f"bwd {dtype} hd{hd} {'causal' if causal else 'full':6s} {seqlen:6d} " + " | ".join(line),
          flush=True)
    del inputs
    torch.cuda.empty_cache()
for (method, name), ratios in summary.items():
    print(f"SUMMARY {dtype} {method} {name}: mean {statistics.mean(ratios):.3f} median "
          f"{statistics.median(ratios):.3f} min {min(ratios):.3f}")
