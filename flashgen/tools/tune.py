"""`flashgen tune`: time tile shapes per head dim on the present GPU, forward and backward, each
checked for correctness first, against PyTorch's FLASH_ATTENTION in the same process, and write
the winners into the config.

Candidates come from a small grid filtered by the same resource checks the config uses; a tile
that fails to compile, spills registers (ptxas), gives a wrong result or does not fit is
reported and skipped, never chosen. The winner per head dim has the best geometric-mean TFLOP/s
over every dtype and causality measured, since the config holds one tile per (arch, head dim,
direction). Only the main tiles are tuned: a head dim's [[...variants]] stay as written, and a
winner equal to one of them makes the config refuse to load (so --write stops, naming it).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import astuple

from codegen import build, resources
from codegen.arch import ARCHS
from codegen.config import BACKWARD_KEYS, BACKWARD_TABLE, FORWARD_KEYS, Tile
from codegen.spec import KernelSpec

# Per direction: the tile keys (the config's names) and the values tried.
GRIDS = {
    "fwd": {"block_m": (64, 128), "block_n": (32, 64, 128), "warps": (4, 8), "kv_stages": (2, 3)},
    "bwd": {"block_m": (64, 128), "block_n": (64, 128), "warps": (4, 8), "q_stages": (1, 2)},
}
_PROBLEMS = {"fwd": resources.tile_problems, "bwd": resources.backward_tile_problems}
# The odd-sized problem each candidate must get right before it is timed.
_CHECK_SHAPE = (2, 211, 333, 4, 2)  # batch, seqlen_q, seqlen_k, heads, heads_kv


def candidate_tiles(arch: str, head_dim: int, direction: str = "fwd") -> list[Tile]:
    """Every grid tile that fits the arch's shared memory and the register budget."""
    tiles = [Tile(*values) for values in itertools.product(*GRIDS[direction].values())]
    return [t for t in tiles
            if not _PROBLEMS[direction](head_dim, *astuple(t), ARCHS[arch].smem_limit)]


def verify(spec: KernelSpec, torch_dtype) -> str | None:
    """None when the kernel matches the fp32 reference on odd sizes (poisoned outputs), else why
    not."""
    import torch

    batch, seqlen_q, seqlen_k, heads, heads_kv = _CHECK_SHAPE
    q = torch.randn(batch, seqlen_q, heads, spec.head_dim, device="cuda", dtype=torch_dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, spec.head_dim, device="cuda", dtype=torch_dtype)
    v = torch.randn_like(k)
    check = _verify_forward if spec.direction == "fwd" else _verify_backward
    try:
        check(spec, q, k, v)
    except AssertionError as e:
        return str(e)
    return None


def _verify_forward(spec: KernelSpec, q, k, v) -> None:
    import torch

    from flashgen import forward, loader, schedule
    from flashgen.reference import assert_close_fa2, attention_ref

    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    offset = k.shape[1] - q.shape[1]
    forward.launch(loader.launcher(spec), q, k, v, out, lse, spec.head_dim ** -0.5, offset,
                   schedule.for_spec(spec, q.shape[1]))
    assert_close_fa2(out, attention_ref(q, k, v, spec.causal)[0],
                     attention_ref(q, k, v, spec.causal, upcast=False)[0])


def _verify_backward(spec: KernelSpec, q, k, v) -> None:
    """The candidate's gradients, from the configured forward's out and lse."""
    import torch

    from flashgen import backward, flash_attn_func, loader
    from flashgen.reference import GRADIENT_EPS, assert_close_fa2

    dout = torch.randn_like(q)
    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, causal=spec.causal, return_attn_probs=True)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    offset = k.shape[1] - q.shape[1]
    backward.launch(loader.launcher(spec), q, k, v, out, dout, lse, *grads,
                    spec.head_dim ** -0.5, offset, False, backward.grid(spec, q, k, False))
    expected, same_dtype = (_reference_grads(q, k, v, dout, spec.causal, upcast)
                            for upcast in (True, False))
    for name, grad, ref, pt in zip(("dq", "dk", "dv"), grads, expected, same_dtype):
        assert_close_fa2(grad, ref, pt, name, eps=GRADIENT_EPS)


def _reference_grads(q, k, v, dout, causal: bool, upcast: bool):
    import torch

    from flashgen.reference import attention_ref

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(attention_ref(*leaves, causal=causal, upcast=upcast)[0], leaves,
                               dout)


def sweep(specs: list[KernelSpec], seqlen: int = 4096, log=print) -> list[dict]:
    """Builds all specs in one ninja run, then verifies and times each. Returns one row per spec
    with TFLOP/s, or the reason it was skipped."""
    import torch

    try:
        build.build(specs)
    except build.BuildError as e:  # keep the kernels that did build
        log(str(e).splitlines()[0])
    torch_dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows = []
    for spec in specs:
        row = {"name": spec.name, "direction": spec.direction, "dtype": spec.dtype,
               "head_dim": spec.head_dim, "causal": spec.causal, "tile": spec.tile.suffix,
               "seqlen": seqlen}
        rows.append(row)
        problem = _unusable(spec) or verify(spec, torch_dtypes[spec.dtype])
        if problem:
            row["skipped"] = problem
            log(f"{spec.name:48s} skipped: {problem}")
            continue
        row["tflops"], row["fa2_tflops"] = _time(spec, torch_dtypes[spec.dtype], seqlen)
        log(f"{spec.name:48s} {row['tflops']:6.1f} TFLOP/s  FLASH_ATTENTION "
            f"{row['fa2_tflops']:6.1f}  ratio {row['tflops'] / row['fa2_tflops']:.2f}")
    return rows


def _unusable(spec: KernelSpec) -> str | None:
    entry = build.find_entry(spec)
    if entry is None:
        return "did not compile"
    spilled = entry.resources.get("spill_bytes", 0)
    return f"spills {spilled} bytes of registers" if spilled else None


def _time(spec: KernelSpec, torch_dtype, seqlen: int) -> tuple[float, float]:
    """TFLOP/s of the candidate and of FLASH_ATTENTION in the same direction, FlashAttention's
    benchmark shape, on the same inputs."""
    import torch

    from flashgen import backward, bench, flash_attn_func, forward, loader, schedule

    batch, heads = bench.grid_shape(seqlen, spec.head_dim)
    inputs = [[torch.randn(batch, seqlen, heads, spec.head_dim, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(3)]
    launcher = loader.launcher(spec)
    scale = spec.head_dim ** -0.5
    if spec.direction == "fwd":
        out = torch.empty_like(inputs[0][0])
        lse = torch.empty(batch, heads, seqlen, device="cuda")
        sets = inputs
        ranks_per_round = schedule.for_spec(spec, seqlen)

        def candidate(q, k, v):
            forward.launch(launcher, q, k, v, out, lse, scale, 0, ranks_per_round)
    else:
        grads = [torch.empty_like(t) for t in inputs[0]]
        with torch.no_grad():
            sets = [(q, k, v, *flash_attn_func(q, k, v, causal=spec.causal,
                                               return_attn_probs=True)[:2], torch.randn_like(q))
                    for q, k, v in inputs]

        bwd_grid = backward.grid(spec, *inputs[0][:2], False)

        def candidate(q, k, v, out, lse, dout):
            backward.launch(launcher, q, k, v, out, dout, lse, *grads, scale, 0, False, bwd_grid)

    mode = spec.direction
    flops = bench.mode_flops(mode, batch, heads, seqlen, seqlen, spec.head_dim, spec.causal)
    ours = flops / bench.time_ms(candidate, sets) / 1e9
    peer = bench.measure(bench.PEER, mode, spec.causal, inputs, flops)
    return ours, peer.get("tflops", float("nan"))


def pick_winners(rows: list[dict]) -> dict[tuple[str, int], Tile]:
    """Per (direction, head dim), the tile with the best geometric-mean TFLOP/s among those that
    ran every (dtype, causal) cell measured for it."""
    winners = {}
    for key in sorted({(r["direction"], r["head_dim"]) for r in rows}):
        mine = [r for r in rows if (r["direction"], r["head_dim"]) == key]
        cells = {(r["dtype"], r["causal"]) for r in mine}
        scores = {}
        for tile in sorted({r["tile"] for r in mine}):
            timed = {(r["dtype"], r["causal"]): r["tflops"] for r in mine
                     if r["tile"] == tile and "tflops" in r}
            if set(timed) == cells:
                scores[tile] = math.exp(sum(math.log(t) for t in timed.values()) / len(timed))
        if scores:
            winners[key] = parse_tile(max(scores, key=scores.get))
    return winners


def parse_tile(suffix: str) -> Tile:
    """The inverse of Tile.suffix: "m128n64w4s2" -> Tile(128, 64, 4, 2)."""
    match = re.fullmatch(r"m(\d+)n(\d+)w(\d+)s(\d+)", suffix)
    if not match:
        raise ValueError(f"not a tile suffix: {suffix!r}")
    return Tile(*map(int, match.groups()))


def set_tile(config_text: str, arch: str, head_dim: int, tile: Tile, direction: str = "fwd") -> str:
    """The config text with [arch.<arch>.head_dim.<head_dim>] (or its .backward subtable) set to
    tile; comments elsewhere are kept, a missing table is appended."""
    suffix, keys = ("", FORWARD_KEYS) if direction == "fwd" else (f".{BACKWARD_TABLE}",
                                                                   BACKWARD_KEYS)
    header = f"[arch.{arch}.head_dim.{head_dim}{suffix}]"
    body = "".join(f"{key} = {value}\n" for key, value in zip(keys, astuple(tile)))
    # The header and its key = value lines; blank lines and comments after them stay.
    pattern = re.compile(rf"^{re.escape(header)}\n(?:[a-z_]+\s*=.*(?:\n|$))*", re.MULTILINE)
    if pattern.search(config_text):
        return pattern.sub(lambda _: f"{header}\n{body}", config_text, count=1)
    return config_text.rstrip() + f"\n\n{header}\n{body}"
