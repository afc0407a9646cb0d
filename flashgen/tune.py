"""`flashgen tune`: time tile shapes per head dim on the present GPU, each checked for
correctness first, against PyTorch's FLASH_ATTENTION in the same process, and write the winners
into the config.

Candidates come from a small grid filtered by the same resource checks the config uses; a tile
that fails to compile, spills registers (ptxas), gives a wrong result or does not fit is
reported and skipped, never chosen. The winner per head dim has the best geometric-mean TFLOP/s
over every dtype and causality measured, since the config holds one tile per (arch, head dim).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import astuple

from codegen import build, resources
from codegen.arch import ARCHS
from codegen.config import FORWARD_KEYS, Tile
from codegen.spec import KernelSpec

GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "warps": (4, 8), "kv_stages": (2, 3)}


def candidate_tiles(arch: str, head_dim: int) -> list[Tile]:
    """Every grid tile that fits the arch's shared memory and the register budget."""
    tiles = [Tile(*values) for values in itertools.product(*GRID.values())]
    return [t for t in tiles if not resources.tile_problems(
        head_dim, t.block_m, t.block_n, t.warps, t.stages, ARCHS[arch].smem_limit)]


def verify(spec: KernelSpec, torch_dtype) -> str | None:
    """None when the kernel matches the fp32 reference on odd sizes, else why not."""
    import torch

    from flashgen import forward, loader
    from flashgen.reference import assert_close_fa2, attention_ref

    q = torch.randn(2, 211, 4, spec.head_dim, device="cuda", dtype=torch_dtype)
    k = torch.randn(2, 333, 2, spec.head_dim, device="cuda", dtype=torch_dtype)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(2, 4, 211, device="cuda")
    scale = spec.head_dim ** -0.5
    forward.launch(loader.launcher(spec), q, k, v, out, lse, scale, 333 - 211)
    try:
        assert_close_fa2(out, attention_ref(q, k, v, spec.causal)[0],
                         attention_ref(q, k, v, spec.causal, upcast=False)[0])
    except AssertionError as e:
        return str(e)
    return None


def sweep(specs: list[KernelSpec], seqlen: int = 4096, log=print) -> list[dict]:
    """Builds all specs in one ninja run, then verifies and times each. Returns one row per spec
    with TFLOP/s, or the reason it was skipped."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashgen import bench, forward, loader

    try:
        build.build(specs)
    except build.BuildError as e:  # keep the kernels that did build
        log(str(e).splitlines()[0])
    torch_dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows = []
    for spec in specs:
        row = {"name": spec.name, "dtype": spec.dtype, "head_dim": spec.head_dim,
               "causal": spec.causal, "tile": spec.tile.suffix, "seqlen": seqlen}
        rows.append(row)
        entry = build.find_entry(spec)
        if entry is None:
            row["skipped"] = "did not compile"
            continue
        spilled = entry.resources.get("spill_bytes", 0)
        if spilled:
            row["skipped"] = f"spills {spilled} bytes of registers"
            log(f"{spec.name:48s} skipped: {row['skipped']}")
            continue
        dtype = torch_dtypes[spec.dtype]
        problem = verify(spec, dtype)
        if problem:
            row["skipped"] = f"wrong result: {problem}"
            log(f"{spec.name:48s} skipped: {row['skipped']}")
            continue
        batch, heads = bench.grid_shape(seqlen, spec.head_dim)
        inputs = [[torch.randn(batch, seqlen, heads, spec.head_dim, device="cuda", dtype=dtype)
                   for _ in range(3)] for _ in range(3)]
        out = torch.empty_like(inputs[0][0])
        lse = torch.empty(batch, heads, seqlen, device="cuda")
        launcher = loader.launcher(spec)

        def run(q, k, v):
            forward.launch(launcher, q, k, v, out, lse, spec.head_dim ** -0.5, 0)

        def fa2(q, k, v):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=spec.causal)

        flops = bench.forward_flops(batch, heads, seqlen, seqlen, spec.head_dim, spec.causal)
        row["tflops"] = flops / bench.time_ms(run, inputs) / 1e9
        row["fa2_tflops"] = flops / bench.time_ms(fa2, inputs) / 1e9
        log(f"{spec.name:48s} {row['tflops']:6.1f} TFLOP/s  FLASH_ATTENTION "
            f"{row['fa2_tflops']:6.1f}  ratio {row['tflops'] / row['fa2_tflops']:.2f}")
    return rows


def pick_winners(rows: list[dict]) -> dict[int, Tile]:
    """Per head dim, the tile with the best geometric-mean TFLOP/s among those that ran every
    (dtype, causal) cell measured for that head dim."""
    winners = {}
    for head_dim in sorted({r["head_dim"] for r in rows}):
        mine = [r for r in rows if r["head_dim"] == head_dim]
        cells = {(r["dtype"], r["causal"]) for r in mine}
        scores = {}
        for tile in sorted({r["tile"] for r in mine}):
            timed = {(r["dtype"], r["causal"]): r["tflops"] for r in mine
                     if r["tile"] == tile and "tflops" in r}
            if set(timed) == cells:
                scores[tile] = math.exp(sum(math.log(t) for t in timed.values()) / len(timed))
        if scores:
            winners[head_dim] = parse_tile(max(scores, key=scores.get))
    return winners


def parse_tile(suffix: str) -> Tile:
    """The inverse of Tile.suffix: "m128n64w4s2" -> Tile(128, 64, 4, 2)."""
    match = re.fullmatch(r"m(\d+)n(\d+)w(\d+)s(\d+)", suffix)
    if not match:
        raise ValueError(f"not a tile suffix: {suffix!r}")
    return Tile(*map(int, match.groups()))


def set_tile(config_text: str, arch: str, head_dim: int, tile: Tile) -> str:
    """The config text with [arch.<arch>.head_dim.<head_dim>] set to tile; comments elsewhere
    are kept, a missing table is appended."""
    header = f"[arch.{arch}.head_dim.{head_dim}]"
    body = "".join(f"{key} = {value}\n" for key, value in zip(FORWARD_KEYS, astuple(tile)))
    # The header and its key = value lines; blank lines and comments after them stay.
    pattern = re.compile(rf"^{re.escape(header)}\n(?:[a-z_]+\s*=.*(?:\n|$))*", re.MULTILINE)
    if pattern.search(config_text):
        return pattern.sub(lambda _: f"{header}\n{body}", config_text, count=1)
    return config_text.rstrip() + f"\n\n{header}\n{body}"
