"""`flashgen bench`: flashgen against PyTorch's SDPA backends, in one process, on one GPU.

FlashAttention's convention: batch * seqlen = 16k tokens, heads * head_dim = 2048 (--batch and
--heads replace either, e.g. batch 1 for the few-sequence shapes where the forward's shape-aware
tile choice pays: flashgen_main_tile times the main tile alone). Forward FLOPs
are 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved when causal; the backward counts
2.5x the forward (five matmuls to the forward's two), forward + backward 3.5x. Times are medians
of CUDA-event-timed calls after warm-up, issued back to back (host work overlaps earlier GPU
work, as in training), on fresh random inputs, rotating input sets when they would fit in L2.
Each cell is measured per mode: fwd (the forward), bwd (out.backward(dout) of a forward run
once, untimed, as FlashAttention's benchmark_backward does) and fwd_bwd (both)."""

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
# Timed only when asked for (--impl): what deterministic=True costs flashgen's backward, and
# flashgen's forward on one tile whatever the shape (forward.forced_tile): the main tile, or the
# head dim's first variant.
FORCED_TILES = {"flashgen_main_tile": 0, "flashgen_variant_tile": 1}
OPTIONAL_IMPLEMENTATIONS = ("flashgen_deterministic", *FORCED_TILES)
KNOWN_IMPLEMENTATIONS = IMPLEMENTATIONS + OPTIONAL_IMPLEMENTATIONS
PEER = "FLASH_ATTENTION"  # FlashAttention-2: the ratio column
MAIN_TILE = "flashgen_main_tile"  # when timed, a column of what the shape-aware choice gains
DEFAULT_GRID = {"dtypes": ("bf16", "fp16"), "head_dims": (64, 128, 256),
                "seqlens": (512, 1024, 2048, 4096, 8192, 16384), "causal": (False, True)}
MODES = ("fwd", "bwd", "fwd_bwd")
DEFAULT_MODES = ("fwd", "bwd")
MODE_NAMES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # FlashAttention's count, per forward
SCHEMA_VERSION = 2  # 2: cells of every mode, results may be {"unsupported": why}
# A flashgen result where the forward is timed also names the forward tile that ran ("tile").
RESULT_FORMS = ({"ms", "tflops"}, {"ms", "tflops", "tile"}, {"error"}, {"unsupported"})
CELL_KEYS = {"mode", "dtype", "head_dim", "causal", "seqlen", "batch", "heads", "flops", "results"}

MEMORY_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MEMORY_IMPLS = ("flashgen", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
MEMORY_MODES = ("fwd", "fwd_bwd")  # a backward's peak includes what its forward saved
# Bytes per token may rise this much from the smallest to the largest seqlen and still count as
# linear (allocator rounding); MATH's quadratic score matrix raises it 11x from 1k to 16k.
LINEAR_TOLERANCE = 1.25


def forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def mode_flops(mode: str, batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    return FLOP_FACTOR[mode] * forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal)


def grid_shape(seqlen: int, head_dim: int, batch: int | None = None,
               heads: int | None = None) -> tuple[int, int]:
    """(batch, heads) for the convention above; a given batch or heads replaces the
    convention's."""
    return batch or max(1, TOKENS // seqlen), heads or max(1, HIDDEN // head_dim)


def input_sets(set_bytes: int, l2_bytes: int) -> int:
    """Enough input sets that rotating through them defeats L2 (at most 8)."""
    return max(1, min(8, math.ceil(4 * l2_bytes / max(1, set_bytes))))


def time_ms(fn, inputs: list, warmup: int = 5, repeats: int = 30, reset=None) -> float:
    """Median of CUDA-event-timed calls, rotating through the input sets. The calls go out back
    to back, as a training step issues them: no host synchronisation between calls, so each
    call's host work (Python, autograd, allocation, launches) overlaps the GPU work queued before
    it and shows in its time only where it outlasts that work (bench --overhead times the host
    work alone). reset(*input set), if given, runs untimed before each call; it must not
    synchronise."""
    import torch

    events = []
    for i in range(warmup + repeats):
        args = inputs[i % len(inputs)]
        if reset is not None:
            reset(*args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        if i >= warmup:
            events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def timed_call(mode: str, fn, inputs: list) -> tuple:
    """(fn, input sets, reset) for time_ms, timing `mode` of the implementation fn; call it inside
    backend(name). As FlashAttention's benchmark_backward and benchmark_combined: one untimed
    forward per input set gives the graph (bwd) and the shape of dout, random like a real
    gradient; gradients are set to None before each call, so accumulating into them adds no work."""
    import torch

    if mode == "fwd":
        return fn, inputs, None
    sets = []
    for tensors in inputs:
        q, k, v = (t.detach().requires_grad_() for t in tensors)  # shares the inputs' memory
        out = fn(q, k, v)
        sets.append((q, k, v, out if mode == "bwd" else None, torch.randn_like(out)))
    if mode == "bwd":
        return _backward, sets, _clear_grads
    return (lambda q, k, v, _, dout: fn(q, k, v).backward(dout)), sets, _clear_grads


def _backward(q, k, v, out, dout):
    out.backward(dout, retain_graph=True)


def _clear_grads(q, k, v, *_):
    q.grad = k.grad = v.grad = None


def implementation(name: str, causal: bool):
    """A callable (q, k, v) on (batch, seq, heads, dim) tensors. SDPA backends must be called
    inside backend(name): entered once around a whole timing loop, so its cost stays out of
    the numbers."""
    import torch.nn.functional as F

    if name.startswith("flashgen"):
        from flashgen import flash_attn_func

        deterministic = name == "flashgen_deterministic"
        return lambda q, k, v: flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    return lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)


def backend(name: str):
    """The context that selects an SDPA backend, or flashgen's forward tile (none for
    flashgen itself: it picks by shape)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name in FORCED_TILES:
        from flashgen import forward

        return forward.forced_tile(FORCED_TILES[name])
    if name.startswith("flashgen"):
        return contextlib.nullcontext()
    return sdpa_kernel(getattr(SDPBackend, name))


def measure_cells(dtype: str, head_dim: int, causal: bool, seqlen: int, impls,
                  modes=DEFAULT_MODES, batch: int | None = None,
                  heads: int | None = None) -> list[dict]:
    """One cell per mode for this shape, every implementation timed on the same inputs."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    batch, heads = grid_shape(seqlen, head_dim, batch, heads)
    set_bytes = 3 * batch * seqlen * heads * head_dim * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    inputs = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(input_sets(set_bytes, l2))]
    cells = [{"mode": mode, "dtype": dtype, "head_dim": head_dim, "causal": causal,
              "seqlen": seqlen, "batch": batch, "heads": heads,
              "flops": mode_flops(mode, batch, heads, seqlen, seqlen, head_dim, causal),
              "results": {}} for mode in modes]
    for name in impls:
        for cell in cells:
            result = measure(name, cell["mode"], causal, inputs, cell["flops"])
            if name.startswith("flashgen") and cell["mode"] != "bwd" and "tflops" in result:
                result["tile"] = forward_tile(name, inputs[0][0], causal)
            cell["results"][name] = result
            torch.cuda.empty_cache()
    return cells


def forward_tile(name: str, q, causal: bool) -> str:
    """The tile of the forward kernel that the flashgen implementation `name` runs on q."""
    from flashgen import forward
    from flashgen.validate import SUPPORTED_DTYPES

    batch, seqlen_q, heads, head_dim = q.shape
    with backend(name):
        spec = forward.kernel_for(q.device, SUPPORTED_DTYPES[q.dtype], head_dim, causal,
                                  batch * heads, seqlen_q)
    return spec.tile.suffix


def measure(name: str, mode: str, causal: bool, inputs: list, flops: float) -> dict:
    """{"ms", "tflops"} of one implementation in one mode, or why it did not run."""
    try:
        with backend(name):
            fn, sets, reset = timed_call(mode, implementation(name, causal), inputs)
            ms = time_ms(fn, sets, reset=reset)
        return {"ms": ms, "tflops": flops / ms / 1e9}
    except NotImplementedError as e:  # a subclass of RuntimeError: caught first
        return {"unsupported": _first_line(e)}
    except RuntimeError as e:  # out of memory, or the backend has no kernel for this shape
        return {"error": _first_line(e)}


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def ratio(cell: dict, name: str = "flashgen", peer: str = PEER) -> float | None:
    ours, theirs = cell["results"].get(name, {}), cell["results"].get(peer, {})
    if "tflops" in ours and "tflops" in theirs:
        return ours["tflops"] / theirs["tflops"]
    return None


def tflops_text(result: dict | None) -> str:
    """TFLOP/s with one decimal, and the forward tile that ran if known; n/a when it did not run
    (out of memory, no kernel for the shape) or was not measured; unsupported when the
    implementation lacks the mode."""
    if result and "tflops" in result:
        return f"{result['tflops']:.1f}" + (f" ({result['tile']})" if "tile" in result else "")
    return "unsupported" if result and "unsupported" in result else "n/a"


def format_cell(cell: dict) -> str:
    parts = [f"{cell['mode']:7s} {cell['dtype']} hd{cell['head_dim']:<3d} "
             f"{'causal' if cell['causal'] else 'full  '} seqlen {cell['seqlen']:6d} "
             f"({cell['batch']} x {cell['heads']})"]
    parts += [f"{name} {tflops_text(result):>6s}" for name, result in cell["results"].items()]
    r = ratio(cell)
    parts.append(f"flashgen/{PEER} {r:.2f}x" if r else f"flashgen/{PEER} n/a")
    gain = ratio(cell, peer=MAIN_TILE)
    if gain:
        parts.append(f"flashgen/{MAIN_TILE} {gain:.2f}x")
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
    """HEAD, with "+dirty" when the working tree differs from it (as on a machine that received a
    copy of the files but kept an older .git)."""
    from codegen.paths import REPO_ROOT

    def git(*args) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run(dtypes, head_dims, seqlens, causal, impls=IMPLEMENTATIONS, modes=DEFAULT_MODES,
        batch: int | None = None, heads: int | None = None, log=print) -> dict:
    """Measures every cell of the grid in every mode; returns the result document (see
    check_schema). batch and heads replace grid_shape's convention where given."""
    cells = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for is_causal in causal:
                for seqlen in seqlens:
                    for cell in measure_cells(dtype, head_dim, is_causal, seqlen, impls, modes,
                                              batch, heads):
                        cells.append(cell)
                        log(format_cell(cell))
    return {"schema": SCHEMA_VERSION, "environment": environment(), "cells": cells}


def upgraded(result: dict) -> dict:
    """A results document in the current schema: version 1 held forward cells only."""
    if result.get("schema") == 1 and isinstance(result.get("cells"), list):
        cells = [{**cell, "mode": "fwd"} for cell in result["cells"]]
        return {**result, "schema": SCHEMA_VERSION, "cells": cells}
    return result


def check_schema(result: dict) -> None:
    """Raises ValueError if the result document is malformed."""
    if result.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"schema version {result.get('schema')!r}, expected {SCHEMA_VERSION}")
    if not isinstance(result.get("environment"), dict) or "gpu" not in result["environment"]:
        raise ValueError("environment with at least 'gpu' is required")
    if not isinstance(result.get("cells"), list):
        raise ValueError("cells must be a list")
    for cell in result["cells"]:
        _check_cell(cell)


def _check_cell(cell: dict) -> None:
    if set(cell) != CELL_KEYS:
        raise ValueError(f"cell keys {sorted(cell)} != {sorted(CELL_KEYS)}")
    mode = cell["mode"]
    if mode not in MODES:
        raise ValueError(f"cell mode {mode!r} is not one of {list(MODES)}")
    flops = mode_flops(mode, cell["batch"], cell["heads"], cell["seqlen"], cell["seqlen"],
                       cell["head_dim"], cell["causal"])
    if not math.isclose(cell["flops"], flops, rel_tol=1e-9):
        raise ValueError(f"{mode} cell at seqlen {cell['seqlen']} has flops {cell['flops']:.6g}; "
                         f"its shape gives {flops:.6g} ({FLOP_FACTOR[mode]:g} x forward)")
    for name, value in cell["results"].items():
        if set(value) not in RESULT_FORMS:
            raise ValueError(f"result of {name} needs ms and tflops, an error, or unsupported; "
                             f"got keys {sorted(value)}")


def markdown(result: dict) -> str:
    """One section per mode, in MODES order; in it, one table per (dtype, head dim, causality)."""
    env = result["environment"]
    lines = [f"# flashgen bench: {env['gpu']}", "",
             f"{env['date']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"driver {env.get('driver')}, flashgen {env['flashgen']} ({env.get('flashgen_commit')})",
             "", "TFLOP/s, with flashgen's forward tile in parentheses where known; ratio is "
             "flashgen / FLASH_ATTENTION (FlashAttention-2), vs main tile (when timed) flashgen / "
             "flashgen_main_tile. n/a: did not run (out of memory, or no kernel for the shape); "
             "unsupported: the implementation lacks that mode.", ""]
    impls = [n for n in KNOWN_IMPLEMENTATIONS if any(n in c["results"] for c in result["cells"])]
    for mode in modes_of(result):
        lines += [f"## {mode}: {MODE_NAMES[mode]} (FLOPs = {FLOP_FACTOR[mode]:g} x forward)", ""]
        groups: dict[tuple, list] = {}
        for cell in (c for c in result["cells"] if c["mode"] == mode):
            groups.setdefault((cell["dtype"], cell["head_dim"], cell["causal"]), []).append(cell)
        for cells in groups.values():
            lines += _markdown_table(cells, impls)
    return "\n".join(lines)


def _markdown_table(cells: list[dict], impls: list[str]) -> list[str]:
    """A heading and a table over seqlen for cells of one (mode, dtype, head dim, causality)."""
    first = cells[0]
    # flashgen / each peer, under its column name
    peers = {PEER: "ratio"} | ({MAIN_TILE: "vs main tile"} if MAIN_TILE in impls else {})
    lines = [f"### {first['mode']} {first['dtype']} head dim {first['head_dim']} "
             f"{'causal' if first['causal'] else 'non-causal'}", "",
             "| seqlen | batch x heads | " + " | ".join([*impls, *peers.values()]) + " |",
             "|---" * (len(impls) + len(peers) + 2) + "|"]
    for cell in cells:
        ratios = [ratio(cell, peer=peer) for peer in peers]
        values = ([tflops_text(cell["results"].get(n)) for n in impls]
                  + [f"{r:.2f}" if r else "n/a" for r in ratios])
        lines.append(f"| {cell['seqlen']} | {cell['batch']} x {cell['heads']} | "
                     + " | ".join(values) + " |")
    return lines + [""]


def modes_of(result: dict) -> list[str]:
    return [m for m in MODES if any(c["mode"] == m for c in result["cells"])]


def write(result: dict, out_dir: Path) -> list[Path]:
    check_schema(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    return paths


def plot(result: dict, png: Path) -> list[Path]:
    """One figure per mode, <png's stem>-<mode>.png (one figure of 2 x 12 panels would be
    unreadable): TFLOP/s against seqlen, one panel per (dtype, head dim, causality). Needs
    matplotlib; runs anywhere, so a GPU run's JSON can be plotted on any machine."""
    check_schema(result)
    return [_plot_mode([c for c in result["cells"] if c["mode"] == mode],
                       f"flashgen {MODE_NAMES[mode]}, {result['environment']['gpu']}",
                       png.with_name(f"{png.stem}-{mode}.png")) for mode in modes_of(result)]


def _plot_mode(mode_cells: list, title: str, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c["dtype"], c["head_dim"], c["causal"]) for c in mode_cells})
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for ax, (dtype, head_dim, causal) in zip(axes.flat, panels):
        cells = sorted((c for c in mode_cells if (c["dtype"], c["head_dim"], c["causal"])
                        == (dtype, head_dim, causal)), key=lambda c: c["seqlen"])
        for name in KNOWN_IMPLEMENTATIONS:
            points = [(c["seqlen"], c["results"][name]["tflops"]) for c in cells
                      if "tflops" in c["results"].get(name, {})]
            if points:
                ax.plot(*zip(*points), marker="o", label=name,  # same colour in every figure
                        color=f"C{KNOWN_IMPLEMENTATIONS.index(name)}",
                        linewidth=2.5 if name == "flashgen" else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} hd{head_dim} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def memory(seqlens=MEMORY_SEQLENS, impls=MEMORY_IMPLS, modes=MEMORY_MODES, heads=16,
           head_dim=128, log=print) -> list[dict]:
    """One row per mode and seqlen: each implementation's peak device memory (batch 1, bf16,
    non-causal) beyond the inputs, see peak_bytes. Logs every row, then whether each
    implementation's peak grows linearly with seqlen."""
    rows = []
    for mode in modes:
        for seqlen in seqlens:
            row = {"mode": mode, "seqlen": seqlen,
                   "inputs_bytes": 3 * seqlen * heads * head_dim * 2}
            row.update((name, peak_bytes(name, mode, seqlen, heads, head_dim)) for name in impls)
            rows.append(row)
            log(format_memory_row(row, impls))
    for line in growth_report(rows, impls):
        log(line)
    return rows


def peak_bytes(name: str, mode: str, seqlen: int, heads: int, head_dim: int) -> int | str:
    """Bytes of one forward call (fwd), or of a forward on inputs that require grad and its
    backward (fwd_bwd: the gradients count, dout does not), above the inputs; or "OOM",
    "unsupported" (no backward) or "error" (no kernel for the shape)."""
    import torch

    torch.cuda.empty_cache()
    shape = (1, seqlen, heads, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                           requires_grad=mode == "fwd_bwd") for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16) if mode == "fwd_bwd" else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    try:
        with backend(name):
            out = implementation(name, causal=False)(q, k, v)
            if mode == "fwd_bwd":  # SDPA's out is (batch, heads, seq, dim): only its shape differs
                out.backward(dout.view(out.shape))
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    except NotImplementedError:  # a subclass of RuntimeError: caught first
        return "unsupported"
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    except RuntimeError:
        return "error"


def format_memory_row(row: dict, impls) -> str:
    return f"{row['mode']:7s} seqlen {row['seqlen']:6d}  " + "  ".join(
        f"{n} {row[n] / 2**20:8.1f} MiB" if isinstance(row[n], int) else f"{n} {row[n]:>12s}"
        for n in impls)


def grows_linearly(points: list[tuple[int, int]]) -> bool:
    """Whether peak bytes, given as (seqlen, bytes), grow at most linearly with seqlen: the bytes
    per token at the largest seqlen stay within LINEAR_TOLERANCE of the smallest measured."""
    per_token = [peak / seqlen for seqlen, peak in sorted(points)]
    return per_token[-1] <= LINEAR_TOLERANCE * min(per_token)


def growth_report(rows: list[dict], impls) -> list[str]:
    """Per mode and implementation: linear or not, with the bytes per token at the smallest and
    largest seqlen it ran at."""
    return [_growth_line(mode, name, [(r["seqlen"], r[name]) for r in rows if r["mode"] == mode])
            for mode in dict.fromkeys(row["mode"] for row in rows) for name in impls]


def _growth_line(mode: str, name: str, values: list[tuple[int, int | str]]) -> str:
    points = sorted((n, b) for n, b in values if isinstance(b, int))
    if len(points) < 2:
        why = ", ".join(sorted({b for _, b in values if not isinstance(b, int)}))
        return (f"{mode:7s} {name}: ran at {len(points)} seqlen(s), no growth to judge"
                + (f" ({why})" if why else ""))
    (n0, b0), (n1, b1) = points[0], points[-1]
    return (f"{mode:7s} {name}: {'linear' if grows_linearly(points) else 'NOT linear'}, "
            f"{b0 / n0 / 1024:.1f} KiB per token at seqlen {n0}, {b1 / n1 / 1024:.1f} at {n1}")


def overhead_us(calls: int = 2000) -> dict:
    """Host time per tiny call (batch 1, 1 head, seqlen 64, head dim 64), CPU-bound: flashgen
    against SDPA's FLASH_ATTENTION backend, the forward without grad and the backward (autograd
    included, as the grid times it). Microseconds per call, median of 5 rounds."""
    import time

    import torch

    inputs = [[torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]]

    def per_call(fn, reset=None):
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                if reset is not None:
                    reset()
                fn()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(rounds)

    result = {}
    for mode in ("fwd", "bwd"):
        for name in ("flashgen", PEER):
            with backend(name):
                fn, sets, reset = timed_call(mode, implementation(name, causal=False), inputs)
                result[f"{name}_{mode}_us"] = per_call(
                    lambda: fn(*sets[0]), reset and (lambda: reset(*sets[0])))
        result[f"{mode}_ratio"] = result[f"flashgen_{mode}_us"] / result[f"{PEER}_{mode}_us"]
    return result
