"""Timing the grid's cells: each implementation in each mode on the same inputs, and the result
document of a run (report.py checks and formats it)."""

from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import subprocess
import time

from flashgen.tools.bench import report
from flashgen.tools.bench.grid import (DEFAULT_MODES, FA4, FAMILY_IMPLEMENTATIONS, FP8,
                                       IMPLEMENTATIONS, PINNED_TILES, grid_shape, input_sets,
                                       mode_flops)


def time_ms(fn, inputs: list, warmup: int = 5, repeats: int = 30, reset=None) -> float:
    """Median of time_samples_ms's calls."""
    return statistics.median(time_samples_ms(fn, inputs, warmup, repeats, reset))


def time_samples_ms(fn, inputs: list, warmup: int = 5, repeats: int = 30,
                    reset=None) -> list[float]:
    """CUDA-event times of `repeats` calls after `warmup`, rotating through the input sets. The
    calls go out back to back, as a training step issues them: no host synchronisation between
    calls, so each call's host work (Python, autograd, allocation, launches) overlaps the GPU
    work queued before it and shows in its time only where it outlasts that work (bench
    --overhead times the host work alone). reset(*input set), if given, runs untimed before each
    call; it must not synchronise."""
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
    return [start.elapsed_time(end) for start, end in events]


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

        if name == FP8:  # on inputs cast to e4m3 before timing (measure_cells), out in bf16
            return lambda q, k, v: flash_attn_func(q, k, v, causal=causal)
        deterministic = name == "flashgen_deterministic"
        return lambda q, k, v: flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    if name == FA4:
        return fa4_call(causal=causal)
    return lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)


def fa4_call(**arguments):
    """(q, k, v) -> out of FlashAttention-4's flash_attn_func with these arguments (its
    window_size takes None for an unbounded side); NotImplementedError, saying how to get it,
    where flash-attn-4 is not importable."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as e:
        raise NotImplementedError(f"FlashAttention-4 is not importable ({e}); pip install "
                                  "flash-attn-4") from e
    return lambda q, k, v: flash_attn_func(q, k, v, **arguments)[0]  # (out, lse)


def backend(name: str):
    """The context that selects an SDPA backend, or flashgen's forward tile (none for
    flashgen itself: it picks by shape, nor for FlashAttention-4)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name in PINNED_TILES:
        return _pinned_tile(PINNED_TILES[name])
    if name in FAMILY_IMPLEMENTATIONS:
        return _forced_family(FAMILY_IMPLEMENTATIONS[name])
    if name.startswith("flashgen") or name == FA4:
        return contextlib.nullcontext()
    return sdpa_kernel(getattr(SDPBackend, name))


@contextlib.contextmanager
def _pinned_tile(index: int):
    """Inside, flashgen's mma forward runs its head dim's tile `index` (0: the main tile) for
    every shape. Plans are cleared on both sides: a shape planned outside must be planned again
    inside, and the pinned plans must not outlive the context."""
    from flashgen.families import mma

    with _forced_family("mma"), mma.pinned_forward_tile(index):
        yield


@contextlib.contextmanager
def _forced_family(family: str):
    """Inside, flashgen's forward runs on `family` ($FLASHGEN_FAMILY); plans are cleared on both
    sides, as for a pinned tile."""
    from flashgen import backward, forward

    previous = os.environ.get("FLASHGEN_FAMILY")
    os.environ["FLASHGEN_FAMILY"] = family
    forward.clear_plans()
    backward.clear_plans()
    try:
        yield
    finally:
        if previous is None:
            del os.environ["FLASHGEN_FAMILY"]
        else:
            os.environ["FLASHGEN_FAMILY"] = previous
        forward.clear_plans()
        backward.clear_plans()


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
    inputs_of = {name: inputs for name in impls}
    if FP8 in impls:
        inputs_of[FP8] = [[t.to(torch.float8_e4m3fn) for t in tensors] for tensors in inputs]
    samples = interleaved_samples(impls, modes, lambda name, mode, warmup, repeats:
                                  timed_samples(name, mode, causal, inputs_of[name], warmup,
                                                repeats))
    for cell in cells:
        for name in impls:
            result = _result(samples[name, cell["mode"]], cell["flops"])
            if name.startswith("flashgen") and cell["mode"] != "bwd" and "tflops" in result:
                result["tile"] = forward_tile(name, inputs_of[name][0][0], causal)
            cell["results"][name] = result
    return cells


# A cell's calls per implementation and mode: ROUNDS rounds, each implementation's modes in
# turn within a round, each round ROUND_WARMUP untimed calls and ROUND_REPEATS timed ones, after
# ROUND_REST seconds idle. The board runs at its power cap and its clock drifts over the seconds
# a cell takes (docs/performance.md, Noise): rounds spread every implementation's calls over
# those seconds alike, where one block each would give the first implementation the cell's first
# seconds. Within tens of milliseconds of a busy GPU the cap's controller cuts the clock, and it
# recovers while a slower, cooler kernel runs: without the rest, an implementation's start would
# depend on which ran before it (docs/performance.md, "Timing method: rested rounds").
ROUNDS = 3
ROUND_WARMUP = 3
ROUND_REPEATS = 10
ROUND_REST = 0.5


def interleaved_samples(impls, modes, calls, rounds: int = ROUNDS) -> dict:
    """{(implementation, mode): its timed calls' milliseconds over all rounds, or the result of
    the call that did not run ({"unsupported"} or {"error"}, after which it is not called
    again)}. calls(name, mode, warmup, repeats) times one implementation and mode (as
    timed_samples)."""
    import torch

    samples = {(name, mode): [] for name in impls for mode in modes}
    for _ in range(rounds):
        for name in impls:
            for mode in modes:
                if isinstance(samples[name, mode], dict):
                    continue
                rest(ROUND_REST)
                got = calls(name, mode, ROUND_WARMUP, ROUND_REPEATS)
                if isinstance(got, dict):
                    samples[name, mode] = got
                else:
                    samples[name, mode].extend(got)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    return samples


def rest(seconds: float) -> None:
    """Lets the GPU finish its queued work and idle `seconds` (none without CUDA), so that the
    next calls start from a rested clock whatever ran before them."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        time.sleep(seconds)


def forward_tile(name: str, q, causal: bool) -> str:
    """The tile of the forward kernel that the flashgen implementation `name` runs on q."""
    import torch

    from codegen.arch import arch_for_capability
    from flashgen import forward, fp8, registry
    from flashgen.validate import SUPPORTED_DTYPES

    batch, seqlen_q, heads, head_dim = q.shape
    mask = "causal" if causal else "none"
    if name == FP8:
        arch = arch_for_capability(*torch.cuda.get_device_capability(q.device))
        return registry.candidates(arch, fp8.KIND, "bf16", head_dim, mask)[0].spec.tile.suffix
    with backend(name):
        spec = forward.kernel_for(q.device, SUPPORTED_DTYPES[q.dtype], head_dim, mask,
                                  batch * heads, seqlen_q)
    return spec.tile.suffix


def measure(name: str, mode: str, causal: bool, inputs: list, flops: float) -> dict:
    """{"ms", "tflops"} of one implementation in one mode, timed in one block of calls, or why
    it did not run."""
    return _result(timed_samples(name, mode, causal, inputs, 5, 30), flops)


def timed_samples(name: str, mode: str, causal: bool, inputs: list, warmup: int,
                  repeats: int) -> list[float] | dict:
    """time_samples_ms of one implementation in one mode, or why it did not run
    ({"unsupported"} or {"error"})."""
    if name == FP8 and mode != "fwd":
        return {"unsupported": "flashgen's e4m3 forward has no backward"}
    try:
        with backend(name):
            fn, sets, reset = timed_call(mode, implementation(name, causal), inputs)
            return time_samples_ms(fn, sets, warmup, repeats, reset)
    except NotImplementedError as e:  # a subclass of RuntimeError: caught first
        return {"unsupported": _first_line(e)}
    except AssertionError as e:  # FlashAttention-4 asserts on the inputs it does not take
        return {"unsupported": f"{name}: {_first_line(e)}"}
    except RuntimeError as e:  # out of memory, or the backend has no kernel for this shape
        return {"error": _first_line(e)}


def _result(samples: list[float] | dict, flops: float) -> dict:
    if isinstance(samples, dict):
        return samples
    ms = statistics.median(samples)
    return {"ms": ms, "tflops": flops / ms / 1e9}


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


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
    report.check_schema). batch and heads replace grid_shape's convention where given."""
    cells = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for is_causal in causal:
                for seqlen in seqlens:
                    for cell in measure_cells(dtype, head_dim, is_causal, seqlen, impls, modes,
                                              batch, heads):
                        cells.append(cell)
                        log(report.format_cell(cell))
    return {"schema": report.SCHEMA_VERSION, "environment": environment(), "cells": cells}
