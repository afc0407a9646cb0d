"""A grid cell's backward calls, timed as `flashgen bench` times them (interleaved rounds of
warm-up and timed calls per implementation, each after a rest), each call placed on the GPU's
timeline beside the SM clock, board power and temperature that nvidia-smi samples meanwhile:
which of a cell's calls ran before the power cap's controller cut the clock, and which after.

    python3 scripts/grid_clock_trace.py [--impl flashgen ...] [--rest S] HD,CAUSAL,SEQLEN ...

One line per call (w: warm-up, t: timed), then each implementation's median per cell, the
number the grid would report.
"""

import argparse
import datetime
import statistics
import subprocess
import tempfile
import time

import torch

from flashgen.tools.bench import grid, timing

IMPLEMENTATIONS = ["flashgen", "CUDNN_ATTENTION", "FLASH_ATTENTION"]


def smi_samples(path: str) -> list[tuple[float, float, float, float]]:
    """(host time, SM MHz, watts, degrees C) per nvidia-smi line."""
    rows = []
    for line in open(path):
        parts = [x.strip() for x in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((stamp, *(float(x) for x in parts[1:4])))
        except (ValueError, IndexError):
            pass
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cells", nargs="+", help="HD,CAUSAL(0|1),SEQLEN, in the grid's order")
    parser.add_argument("--impl", action="append", help="in the order each round runs them")
    parser.add_argument("--rest", type=float, default=timing.ROUND_REST,
                        help="seconds idle before each implementation's round (0: none, so "
                        "that each starts at whatever clock the one before it left)")
    args = parser.parse_args()
    names = args.impl or IMPLEMENTATIONS
    log = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,"
                            "temperature.gpu", "--format=csv,noheader,nounits", "-lms", "20"],
                           stdout=log)
    time.sleep(1.0)
    # The GPU's time 0, taken with the queue empty so that host and GPU agree on it.
    origin = torch.cuda.Event(enable_timing=True)
    origin.record()
    torch.cuda.synchronize()
    host_origin = time.time()
    calls = []  # (cell label, flops, implementation, round, call, start event, end event)
    for head_dim, causal, seqlen in (x.split(",") for x in args.cells):
        head_dim, causal, seqlen = int(head_dim), causal == "1", int(seqlen)
        batch, heads = grid.grid_shape(seqlen, head_dim)
        set_bytes = 3 * batch * seqlen * heads * head_dim * 2
        sets = grid.input_sets(set_bytes, torch.cuda.get_device_properties(0).L2_cache_size)
        inputs = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3)] for _ in range(sets)]
        flops = grid.mode_flops("bwd", batch, heads, seqlen, seqlen, head_dim, causal)
        label = f"hd{head_dim} {'causal' if causal else 'none'} {seqlen}"
        for round_ in range(timing.ROUNDS):
            for name in names:
                timing.rest(args.rest)
                with timing.backend(name):
                    fn, call_sets, reset = timing.timed_call(
                        "bwd", timing.implementation(name, causal), inputs)
                    for i in range(timing.ROUND_WARMUP + timing.ROUND_REPEATS):
                        call_args = call_sets[i % len(call_sets)]
                        reset(*call_args)
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                        fn(*call_args)
                        end.record()
                        calls.append((label, flops, name, round_, i, start, end))
                    torch.cuda.synchronize()
                torch.cuda.empty_cache()
    time.sleep(0.2)  # a sample or more after the last call
    smi.terminate()
    smi.wait()
    log.close()
    samples = smi_samples(log.name)
    timed = {}
    for label, flops, name, round_, i, start, end in calls:
        begin = host_origin + origin.elapsed_time(start) / 1e3
        ms = start.elapsed_time(end)
        seen = [s for s in samples if begin - 0.01 <= s[0] <= begin + ms / 1e3 + 0.01]
        mhz, watts, celsius = (statistics.mean(s[k] for s in seen) if seen else 0.0
                               for k in (1, 2, 3))
        kind = "t" if i >= timing.ROUND_WARMUP else "w"
        print(f"{label:18} {name:16} r{round_} {kind}{i:02d} +{begin - host_origin:7.3f} s "
              f"{ms:8.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s {mhz:5.0f} MHz {watts:4.0f} W "
              f"{celsius:3.0f} C")
        if kind == "t":
            timed.setdefault((label, flops, name), []).append(ms)
    for (label, flops, name), ms in timed.items():
        print(f"median {label:18} {name:16} {flops / statistics.median(ms) / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
