"""Sustained backward calls per implementation with the SM clock and board power that
nvidia-smi logs meanwhile: per cell and implementation, the first calls' time and the steady
state's (calls after the first second of a 3-second phase), its mean SM clock, power and energy
per call, and the throttle reasons seen (0x4: the software power cap). Each phase follows half a
second idle, as the grid's cells do.

    python3 scripts/bwd_power.py [--impl flashgen --impl CUDNN_ATTENTION] [--cell 128,0,8192 ...]

--impl FA4 runs FlashAttention-4's SM90 backward, installed as scripts/bwd_vs_fa4.py says.
"""

import argparse
import contextlib
import datetime
import statistics
import subprocess
import tempfile
import time

import torch

from bwd_vs_fa4 import impl  # (scripts/ is this script's import path)
from flashgen.tools.bench import grid
from flashgen.tools.bench.timing import backend, timed_call

CELLS = [(64, False, 8192), (64, True, 8192), (128, False, 8192), (128, True, 8192),
         (128, False, 16384), (64, False, 2048), (128, False, 2048)]
SECONDS = 3.0
SETTLE = 1.0  # seconds of a phase before its steady state


def run_phase(fn, sets, reset) -> tuple[float, float, list, list]:
    """(start, end, the first calls' ms, the steady calls' ms) of SECONDS of back-to-back calls."""
    for i in range(3):
        reset(*sets[i % 2])
        fn(*sets[i % 2])
    torch.cuda.synchronize()
    time.sleep(0.5)
    start, calls = time.time(), []
    while time.time() - start < SECONDS:
        for _ in range(8):
            i = len(calls)
            reset(*sets[i % 2])
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            begin.record()
            fn(*sets[i % 2])
            end.record()
            calls.append((begin, end, time.time()))
        torch.cuda.synchronize()
    ms = [(b.elapsed_time(e), t) for b, e, t in calls]
    return start, time.time(), [m for m, _ in ms[:5]], [m for m, t in ms if t > start + SETTLE]


def read_log(path: str) -> list:
    rows = []
    for line in open(path):
        parts = [x.strip() for x in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((stamp, float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            pass
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", action="append")
    parser.add_argument("--cell", action="append", help="HD,CAUSAL(0|1),SEQLEN")
    args = parser.parse_args()
    names = args.impl or ["flashgen", "CUDNN_ATTENTION"]
    cells = [(int(h), c == "1", int(n)) for h, c, n in (x.split(",") for x in args.cell or [])]
    log = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,"
                            "clocks_event_reasons.active", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=log)
    time.sleep(1.0)
    phases = []
    for head_dim, causal, seqlen in cells or CELLS:
        batch, heads = grid.grid_shape(seqlen, head_dim)
        inputs = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
        flops = 4 * batch * heads * seqlen * seqlen * head_dim * 2.5 / (2 if causal else 1)
        for name in names * 2:  # each implementation twice, alternating
            with contextlib.nullcontext() if name == "FA4" else backend(name):
                phase = run_phase(*timed_call("bwd", impl(name, causal), inputs))
            label = f"hd{head_dim} {'causal' if causal else 'none'} {seqlen} {name}"
            phases.append((label, flops, *phase))
    smi.terminate()
    smi.wait()
    log.close()
    rows = read_log(log.name)
    for label, flops, start, end, first, steady in phases:
        seen = [r for r in rows if start + SETTLE < r[0] < end]
        mhz = statistics.mean(r[1] for r in seen) if seen else 0.0
        watts = statistics.mean(r[2] for r in seen) if seen else 0.0
        ms0, ms = statistics.median(first), statistics.median(steady)
        print(f"{label:34} first {ms0:7.3f} ms ({flops / ms0 / 1e9:4.0f})  steady {ms:7.3f} ms "
              f"({flops / ms / 1e9:4.0f} TFLOP/s) {mhz:5.0f} MHz {watts:4.0f} W "
              f"{watts * ms / 1e3:5.2f} J/call  {sorted({r[3] for r in seen})}", flush=True)


if __name__ == "__main__":
    main()
