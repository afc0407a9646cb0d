"""Peak device memory per implementation against seqlen, and whether it grows linearly (bench
--memory)."""

from __future__ import annotations

from flashgen.tools.bench.timing import backend, implementation

MEMORY_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MEMORY_IMPLS = ("flashgen", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
MEMORY_MODES = ("fwd", "fwd_bwd")  # a backward's peak includes what its forward saved
# Bytes per token may rise this much from the smallest to the largest seqlen and still count as
# linear (allocator rounding); MATH's quadratic score matrix raises it 11x from 1k to 16k.
LINEAR_TOLERANCE = 1.25


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
