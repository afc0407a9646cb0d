"""`flashgen bench`: flashgen against PyTorch's SDPA backends, in one process, on one GPU.

FlashAttention's convention: batch * seqlen = 16k tokens, heads * head_dim = 2048. Forward FLOPs
are 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved when causal. Times are medians of
CUDA-event-timed calls after warm-up, on fresh random inputs, rotating input sets when they
would fit in L2.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import subprocess
from pathlib import Path

TOKENS = 16384
HIDDEN = 2048
IMPLEMENTATIONS = ("flashgen", "FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
PEER = "FLASH_ATTENTION"  # FlashAttention-2: the ratio column
DEFAULT_GRID = {"dtypes": ("bf16", "fp16"), "head_dims": (64, 128, 256),
                "seqlens": (512, 1024, 2048, 4096, 8192, 16384), "causal": (False, True)}
SCHEMA_VERSION = 1


def forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def grid_shape(seqlen: int, head_dim: int) -> tuple[int, int]:
    """(batch, heads) for the convention above."""
    return max(1, TOKENS // seqlen), max(1, HIDDEN // head_dim)


def input_sets(set_bytes: int, l2_bytes: int) -> int:
    """Enough input sets that rotating through them defeats L2 (at most 8)."""
    return max(1, min(8, math.ceil(4 * l2_bytes / max(1, set_bytes))))


def time_ms(fn, inputs: list, warmup: int = 5, repeats: int = 30) -> float:
    """Median of CUDA-event-timed calls, rotating through the input sets."""
    import torch

    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def implementation(name: str, causal: bool):
    """A callable (q, k, v) on (batch, seq, heads, dim) tensors. SDPA backends must be called
    inside backend(name): entered once around a whole timing loop, so its cost stays out of
    the numbers."""
    import torch.nn.functional as F

    if name == "flashgen":
        from flashgen import flash_attn_func

        return lambda q, k, v: flash_attn_func(q, k, v, causal=causal)
    return lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)


def backend(name: str):
    """The context that selects an SDPA backend (none for flashgen)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return contextlib.nullcontext() if name == "flashgen" else sdpa_kernel(getattr(SDPBackend, name))


def measure_cell(dtype: str, head_dim: int, causal: bool, seqlen: int, impls) -> dict:
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    batch, heads = grid_shape(seqlen, head_dim)
    set_bytes = 3 * batch * seqlen * heads * head_dim * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    inputs = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(input_sets(set_bytes, l2))]
    flops = forward_flops(batch, heads, seqlen, seqlen, head_dim, causal)
    cell = {"mode": "fwd", "dtype": dtype, "head_dim": head_dim, "causal": causal,
            "seqlen": seqlen, "batch": batch, "heads": heads, "flops": flops, "results": {}}
    for name in impls:
        try:
            with backend(name):
                ms = time_ms(implementation(name, causal), inputs)
            cell["results"][name] = {"ms": ms, "tflops": flops / ms / 1e9}
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # backend can't run this shape
            cell["results"][name] = {"error": str(e).splitlines()[0][:200]}
        torch.cuda.empty_cache()
    return cell


def ratio(cell: dict, name: str = "flashgen", peer: str = PEER) -> float | None:
    ours, theirs = cell["results"].get(name, {}), cell["results"].get(peer, {})
    if "tflops" in ours and "tflops" in theirs:
        return ours["tflops"] / theirs["tflops"]
    return None


def format_cell(cell: dict) -> str:
    parts = [f"{cell['dtype']} hd{cell['head_dim']:<3d} {'causal' if cell['causal'] else 'full  '}"
             f" seqlen {cell['seqlen']:6d}"]
    for name, result in cell["results"].items():
        value = f"{result['tflops']:6.1f}" if "tflops" in result else "   n/a"
        parts.append(f"{name} {value}")
    r = ratio(cell)
    parts.append(f"flashgen/{PEER} {r:.2f}x" if r else f"flashgen/{PEER} n/a")
    return "  ".join(parts)


def environment() -> dict:
    import torch

    from flashgen import __version__

    props = torch.cuda.get_device_properties(0)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name, "sm_count": props.multi_processor_count,
        "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "flashgen": __version__,
        "flashgen_commit": _git_commit(),
    }
    try:
        query = "clocks.sm,clocks.max.sm,clocks.mem,driver_version,power.limit"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        env.update(zip(["clock_sm", "clock_sm_max", "clock_mem", "driver", "power_limit"],
                       (v.strip() for v in out.splitlines()[0].split(","))))
    except (OSError, IndexError, subprocess.SubprocessError):
        env["driver"] = None
    return env


def _git_commit() -> str | None:
    from codegen.paths import REPO_ROOT

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def run(dtypes, head_dims, seqlens, causal, impls=IMPLEMENTATIONS, log=print) -> dict:
    """Measures every cell of the grid; returns the result document (see check_schema)."""
    cells = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for is_causal in causal:
                for seqlen in seqlens:
                    cell = measure_cell(dtype, head_dim, is_causal, seqlen, impls)
                    cells.append(cell)
                    log(format_cell(cell))
    return {"schema": SCHEMA_VERSION, "environment": environment(), "cells": cells}


def check_schema(result: dict) -> None:
    """Raises ValueError if the result document is malformed."""
    if result.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"schema version {result.get('schema')!r}, expected {SCHEMA_VERSION}")
    if not isinstance(result.get("environment"), dict) or "gpu" not in result["environment"]:
        raise ValueError("environment with at least 'gpu' is required")
    keys = {"mode", "dtype", "head_dim", "causal", "seqlen", "batch", "heads", "flops", "results"}
    for cell in result.get("cells", []):
        if set(cell) != keys:
            raise ValueError(f"cell keys {sorted(cell)} != {sorted(keys)}")
        for name, value in cell["results"].items():
            if not ("tflops" in value and "ms" in value) and "error" not in value:
                raise ValueError(f"result of {name} needs ms and tflops, or an error")


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# flashgen bench: {env['gpu']}", "",
             f"{env['date']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"driver {env.get('driver')}, flashgen {env['flashgen']} ({env.get('flashgen_commit')})",
             "", "TFLOP/s; the last column is flashgen / FLASH_ATTENTION (FlashAttention-2).", ""]
    impls = [n for n in IMPLEMENTATIONS if any(n in c["results"] for c in result["cells"])]
    groups: dict[tuple, list] = {}
    for cell in result["cells"]:
        groups.setdefault((cell["mode"], cell["dtype"], cell["head_dim"], cell["causal"]),
                          []).append(cell)
    for (mode, dtype, head_dim, causal), cells in groups.items():
        lines += [f"## {mode} {dtype} head dim {head_dim} {'causal' if causal else 'non-causal'}",
                  "", "| seqlen | " + " | ".join(impls) + " | ratio |",
                  "|---" * (len(impls) + 2) + "|"]
        for cell in cells:
            values = [f"{cell['results'][n]['tflops']:.1f}" if "tflops" in cell["results"].get(n, {})
                      else "n/a" for n in impls]
            r = ratio(cell)
            lines.append(f"| {cell['seqlen']} | " + " | ".join(values) +
                         f" | {f'{r:.2f}' if r else 'n/a'} |")
        lines.append("")
    return "\n".join(lines)


def write(result: dict, out_dir: Path) -> list[Path]:
    check_schema(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    return paths


def plot(result: dict, png: Path) -> Path:
    """TFLOP/s against seqlen, one panel per (dtype, head dim, causality). Needs matplotlib; runs
    anywhere, so a GPU run's JSON can be plotted on any machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_schema(result)
    panels = sorted({(c["dtype"], c["head_dim"], c["causal"]) for c in result["cells"]})
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for ax, (dtype, head_dim, causal) in zip(axes.flat, panels):
        cells = sorted((c for c in result["cells"] if (c["dtype"], c["head_dim"], c["causal"])
                        == (dtype, head_dim, causal)), key=lambda c: c["seqlen"])
        for name in IMPLEMENTATIONS:
            points = [(c["seqlen"], c["results"][name]["tflops"]) for c in cells
                      if "tflops" in c["results"].get(name, {})]
            if points:
                ax.plot(*zip(*points), marker="o", label=name, linewidth=2.5 if name == "flashgen" else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} hd{head_dim} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"flashgen forward, {result['environment']['gpu']}")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def memory(seqlens=(1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
           impls=("flashgen", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"), heads=16,
           head_dim=128, log=print) -> list[dict]:
    """Peak device memory of one forward call (batch 1), beyond the inputs, per seqlen."""
    import torch

    rows = []
    for seqlen in seqlens:
        row = {"seqlen": seqlen, "inputs_bytes": 3 * seqlen * heads * head_dim * 2}
        for name in impls:
            torch.cuda.empty_cache()
            q, k, v = (torch.randn(1, seqlen, heads, head_dim, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(3))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                with backend(name):
                    out = implementation(name, causal=False)(q, k, v)
                torch.cuda.synchronize()
                row[name] = torch.cuda.max_memory_allocated() - base
                del out
            except (RuntimeError, torch.cuda.OutOfMemoryError):
                row[name] = "OOM"
            del q, k, v
        rows.append(row)
        log("seqlen {:6d}  ".format(seqlen) + "  ".join(
            f"{n} {row[n] / 2**20:8.1f} MiB" if isinstance(row[n], int) else f"{n} {row[n]:>12s}"
            for n in impls))
    return rows


def overhead_us(calls: int = 2000) -> dict:
    """Host time per tiny call (batch 1, 1 head, seqlen 64, head dim 64), CPU-bound: flashgen
    against SDPA's FLASH_ATTENTION backend. Microseconds per call, median of 5 rounds."""
    import time

    import torch

    q, k, v = (torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def per_call(fn):
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(q, k, v)
            rounds.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(rounds)

    ours = per_call(implementation("flashgen", causal=False))
    with backend(PEER):
        theirs = per_call(implementation(PEER, causal=False))
    return {"flashgen_us": ours, f"{PEER}_us": theirs, "ratio": ours / theirs}
