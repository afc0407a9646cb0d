"""`flashgen tune`: time tile shapes per head dim on the present GPU, forward and backward, each
checked for correctness first, against PyTorch's FLASH_ATTENTION in the same process, and write
the winners into the config.

Candidates come from a small grid per family and kind, filtered by the same resource checks the
config uses; a tile that fails to compile, spills registers (ptxas), gives a wrong result or does
not fit is reported and skipped, never chosen. The winner per (family, kind, head dim) has the
best geometric-mean TFLOP/s over every dtype and mask measured and becomes the main tile; a mask
whose own best (over its dtypes) differs gets a [....<mask>] table with the keys that differ, and
loses one it had when they agree. Only the main tiles are tuned: a head dim's [[...alt_tiles]]
stay as written, and a winner equal to one of them makes the config refuse to load (so --write
stops, naming it).
"""

from __future__ import annotations

import itertools
import math
import re

from codegen import build
from codegen.arch import ARCHS
from codegen.config import SCORE_MODS_KEY
from codegen.families import FAMILIES
from codegen.family import Tile
from codegen.spec import KernelSpec
from flashgen import cache
from flashgen.band import Band

# Per family and kind: the values tried for each tile key (the config's names).
GRIDS = {
    "mma": {
        "fwd": {"block_m": (64, 128), "block_n": (32, 64, 128), "warps": (4, 8),
                "kv_stages": (2, 3)},
        "bwd": {"block_m": (64, 128), "block_n": (64, 128), "warps": (4, 8), "q_stages": (1, 2)},
    },
    # block_n sets the speed (docs/performance.md); a third stage, pingpong off and overlap off
    # measured level or slower, so they cost no builds here.
    "hopper": {
        "fwd": {"block_m": (128, 192), "block_n": (64, 80, 112, 128, 144, 176), "kv_stages": (2,),
                "pingpong": (True,), "overlap": (True,)},
        # The resource checks leave one to three tiles per head dim (dQ's split and the
        # registers fix block_m for a block_n; 80 only at head dim 128); the stages are what is
        # left to choose.
        "bwd": {"block_m": (64, 80, 128), "block_n": (64, 128), "q_stages": (1, 2, 3),
                "dq_before_dk": (False, True)},
        # The e4m3 forward: block_n in the 8-bit wgmma's 32-key steps; one-byte K and V leave
        # room for a third stage.
        "fwd_fp8": {"block_m": (128, 192), "block_n": (64, 96, 128, 160, 192, 224, 256),
                    "kv_stages": (2, 3), "pingpong": (True,), "overlap": (True,)},
    },
}
# The odd-sized problem each candidate must get right before it is timed.
_CHECK_SHAPE = (2, 211, 333, 4, 2)  # batch, seqlen_q, seqlen_k, heads, heads_kv


def candidate_tiles(family: str, kind: str, arch: str, head_dim: int) -> list[Tile]:
    """Every grid tile of the family's kind that passes its resource checks on the arch."""
    record = FAMILIES[family].kind(kind)
    grid = GRIDS.get(family, {}).get(kind)
    if grid is None:
        raise ValueError(f"flashgen tune: no tile grid for family {family} kind {kind}")
    tiles = [record.tile(*values)
             for values in itertools.product(*(grid[key] for key in record.tile.keys()))]
    return [t for t in tiles if not record.problems(head_dim, t, ARCHS[arch])]


def _causal(spec: KernelSpec) -> bool:
    """Whether the spec's mask is causal: the reference and the bench's peer take a bool."""
    return spec.mask == "causal"


def verify(spec: KernelSpec, torch_dtype) -> str | None:
    """None when the kernel matches the fp32 reference on odd sizes (poisoned outputs), else why
    not."""
    import torch

    batch, seqlen_q, seqlen_k, heads, heads_kv = _CHECK_SHAPE
    inputs = _input_dtype(spec, torch_dtype)
    q = torch.randn(batch, seqlen_q, heads, spec.head_dim, device="cuda").to(inputs)
    k = torch.randn(batch, seqlen_k, heads_kv, spec.head_dim, device="cuda").to(inputs)
    v = torch.randn(batch, seqlen_k, heads_kv, spec.head_dim, device="cuda").to(inputs)
    check = {"fwd": _verify_forward, "fwd_fp8": _verify_fp8_forward}.get(spec.kind,
                                                                          _verify_backward)
    try:
        check(spec, q, k, v)
    except AssertionError as e:
        return str(e)
    return None


def _forward_fields(spec: KernelSpec, batch_heads: int, seqlen_q: int, device_index: int) -> dict:
    """The family's FwdParams fields for running `spec` on this shape: its plan with `spec` as
    the only candidate."""
    from flashgen import families

    return families.runtime(spec.family).forward_plan((spec,), batch_heads, seqlen_q,
                                                      device_index)[1]


def _verify_forward(spec: KernelSpec, q, k, v) -> None:
    import torch

    from flashgen import forward, loader
    from flashgen.reference import assert_close_fa2, attention_ref

    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    band = Band(k.shape[1] - q.shape[1])  # bottom-right, as attention_ref's causal default
    fields = _forward_fields(spec, q.shape[0] * q.shape[2], q.shape[1], q.get_device())
    forward.run(loader.launcher(spec), q, k, v, out, lse, spec.head_dim ** -0.5, band, fields)
    assert_close_fa2(out, attention_ref(q, k, v, _causal(spec))[0],
                     attention_ref(q, k, v, _causal(spec), upcast=False)[0])


def _input_dtype(spec: KernelSpec, torch_dtype):
    """The candidate's inputs' dtype: e4m3 for the fp8 forward (spec.dtype is its output's)."""
    import torch

    return torch.float8_e4m3fn if spec.kind == "fwd_fp8" else torch_dtype


def _verify_fp8_forward(spec: KernelSpec, q, k, v) -> None:
    """Within the rule's budget of the same attention in fp32 with P rounded to e4m3."""
    import torch

    from flashgen import fp8
    from flashgen.reference import assert_close_fa2, attention_ref

    out_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=out_dtype)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    fp8.run(spec, q, k, v, out, lse, spec.head_dim ** -0.5, Band(k.shape[1] - q.shape[1]))
    qf, kf, vf = (t.float() for t in (q, k, v))
    assert_close_fa2(out, attention_ref(qf, kf, vf, _causal(spec))[0],
                     attention_ref(qf, kf, vf, _causal(spec), p_dtype=torch.float8_e4m3fn)[0],
                     eps=1e-3)


def _verify_backward(spec: KernelSpec, q, k, v) -> None:
    """The candidate's gradients, from the configured forward's out and lse."""
    import torch

    from flashgen import backward, flash_attn_func, loader
    from flashgen.reference import GRADIENT_EPS, assert_close_fa2

    dout = torch.randn_like(q)
    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, causal=_causal(spec), return_attn_probs=True)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward.run(loader.launcher(spec), q, k, v, out, dout, lse, *grads, spec.head_dim ** -0.5,
                 Band(k.shape[1] - q.shape[1]), False)
    expected, same_dtype = (_reference_grads(q, k, v, dout, _causal(spec), upcast)
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
        row = {"name": spec.name, "family": spec.family, "kind": spec.kind, "dtype": spec.dtype,
               "head_dim": spec.head_dim, "mask": spec.mask, "tile": spec.tile.suffix,
               "seqlen": seqlen}
        rows.append(row)
        problem = _unusable(spec) or verify(spec, torch_dtypes[spec.dtype])
        if problem:
            row["skipped"] = problem
            log(f"{spec.name:52s} skipped: {problem}")
            continue
        row["tflops"], row["fa2_tflops"] = _time(spec, torch_dtypes[spec.dtype], seqlen)
        log(f"{spec.name:52s} {row['tflops']:6.1f} TFLOP/s  FLASH_ATTENTION "
            f"{row['fa2_tflops']:6.1f}  ratio {row['tflops'] / row['fa2_tflops']:.2f}")
    return rows


def _unusable(spec: KernelSpec) -> str | None:
    entry = cache.find_entry(spec)
    if entry is None:
        return "did not compile"
    if entry.resources.get("wgmma_serialised"):
        return "ptxas serialises its wgmma instructions for want of registers (C7512)"
    spilled = entry.resources.get("spill_bytes", 0)
    return f"spills {spilled} bytes of registers" if spilled else None


def _time(spec: KernelSpec, torch_dtype, seqlen: int) -> tuple[float, float]:
    """TFLOP/s of the candidate and of FLASH_ATTENTION in the same kind (fwd or bwd),
    FlashAttention's benchmark shape, on the same inputs."""
    import torch

    from flashgen import backward, flash_attn_func, forward, loader
    from flashgen.tools.bench import grid, timing

    batch, heads = grid.grid_shape(seqlen, spec.head_dim)
    inputs = [[torch.randn(batch, seqlen, heads, spec.head_dim, device="cuda", dtype=torch_dtype)
               for _ in range(3)] for _ in range(3)]
    launcher = loader.launcher(spec)
    scale = spec.head_dim ** -0.5
    causal = _causal(spec)
    if spec.kind == "fwd_fp8":  # the kernel alone: V^T is made before timing
        from flashgen import fp8

        out = torch.empty_like(inputs[0][0])
        lse = torch.empty(batch, heads, seqlen, device="cuda")
        sets = [[q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn),
                 fp8.transposed_v(v.to(torch.float8_e4m3fn)).permute(0, 2, 1, 3)]
                for q, k, v in inputs]

        def candidate(q, k, vt):
            forward.run(launcher, q, k, vt, out, lse, scale, Band(), {})
    elif spec.kind == "fwd":
        out = torch.empty_like(inputs[0][0])
        lse = torch.empty(batch, heads, seqlen, device="cuda")
        sets = inputs
        fields = _forward_fields(spec, batch * heads, seqlen, out.get_device())

        def candidate(q, k, v):
            forward.run(launcher, q, k, v, out, lse, scale, Band(), fields)
    else:
        grads = [torch.empty_like(t) for t in inputs[0]]
        with torch.no_grad():
            sets = [(q, k, v, *flash_attn_func(q, k, v, causal=causal,
                                               return_attn_probs=True)[:2], torch.randn_like(q))
                    for q, k, v in inputs]

        def candidate(q, k, v, out, lse, dout):
            backward.run(launcher, q, k, v, out, dout, lse, *grads, scale, Band(), False)

    mode = "fwd" if spec.kind == "fwd_fp8" else spec.kind  # FLASH_ATTENTION's bf16 forward
    flops = grid.mode_flops(mode, batch, heads, seqlen, seqlen, spec.head_dim, causal)
    # Each from a rested clock, as the bench's rounds: a candidate timed right after a hotter
    # kernel would start at a clock the power cap had cut.
    timing.rest(timing.ROUND_REST)
    ours = flops / timing.time_ms(candidate, sets) / 1e9
    timing.rest(timing.ROUND_REST)
    peer = timing.measure(grid.PEER, mode, causal, inputs, flops)
    return ours, peer.get("tflops", float("nan"))


def pick_winners(rows: list[dict]) -> dict[tuple[str, str, int], Tile]:
    """Per (family, kind, head dim), the tile with the best geometric-mean TFLOP/s among those
    that ran every (dtype, mask) cell measured for it."""
    return _best_tiles(rows, ("family", "kind", "head_dim"))


def pick_mask_winners(rows: list[dict]) -> dict[tuple[str, str, int, str], Tile]:
    """Per (family, kind, head dim, mask), the best tile over that mask's dtypes alone."""
    return _best_tiles(rows, ("family", "kind", "head_dim", "mask"))


def _best_tiles(rows: list[dict], by: tuple[str, ...]) -> dict[tuple, Tile]:
    winners = {}
    for key in sorted({tuple(r[f] for f in by) for r in rows}):
        mine = [r for r in rows if tuple(r[f] for f in by) == key]
        cells = {(r["dtype"], r["mask"]) for r in mine}
        scores = {}
        for tile in sorted({r["tile"] for r in mine}):
            timed = {(r["dtype"], r["mask"]): r["tflops"] for r in mine
                     if r["tile"] == tile and "tflops" in r}
            if set(timed) == cells:
                scores[tile] = math.exp(sum(math.log(t) for t in timed.values()) / len(timed))
        if scores:
            family, kind = key[:2]
            winners[key] = parse_tile(max(scores, key=scores.get),
                                      FAMILIES[family].kind(kind).tile)
    return winners


def parse_tile(suffix: str, tile_class: type[Tile]) -> Tile:
    """The inverse of Tile.suffix: "m128n64w4s2" -> tile_class(128, 64, 4, 2); a flag's 0 or 1
    becomes False or True."""
    pattern = "".join(rf"{re.escape(letter)}(\d+)" for letter in tile_class.SUFFIX)
    match = re.fullmatch(pattern, suffix)
    if not match:
        raise ValueError(f"not a {tile_class.__name__} suffix: {suffix!r}")
    flags = tile_class.flags()
    return tile_class(*(bool(int(value)) if key in flags else int(value)
                        for key, value in zip(tile_class.keys(), match.groups())))


def _toml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _kind_table(family: str, kind: str, arch: str, head_dim: int) -> str:
    """The kind's table of [<family>.<arch>.head_dim.<head_dim>]: the table itself, or its
    subtable such as .backward."""
    table = FAMILIES[family].kind(kind).table
    return f"{family}.{arch}.head_dim.{head_dim}{f'.{table}' if table else ''}"


def _set_table(config_text: str, header: str, body: str | None) -> str:
    """The config text with the table under header holding body's key = value lines (a missing
    table is appended), or without the table when body is None; comments elsewhere are kept."""
    # The header and its key = value lines; blank lines and comments after them stay.
    pattern = re.compile(rf"^{re.escape(header)}\n(?:[a-z_]+\s*=.*(?:\n|$))*", re.MULTILINE)
    if body is None:
        return re.sub(rf"\n*{pattern.pattern}", "\n", config_text, count=1, flags=re.MULTILINE)
    if pattern.search(config_text):
        return pattern.sub(lambda _: f"{header}\n{body}", config_text, count=1)
    return config_text.rstrip() + f"\n\n{header}\n{body}"


def set_tile(config_text: str, family: str, kind: str, arch: str, head_dim: int,
             tile: Tile) -> str:
    """The config text with the kind's table of the head dim set to tile."""
    body = "".join(f"{key} = {_toml(getattr(tile, key))}\n" for key in tile.keys())
    return _set_table(config_text, f"[{_kind_table(family, kind, arch, head_dim)}]", body)


def set_mask_tile(config_text: str, family: str, kind: str, arch: str, head_dim: int, mask: str,
                  main: Tile, tile: Tile | None) -> str:
    """The config text with the mask's table under the kind's (the keys where tile differs from
    the main tile, and the score modifiers the table keeps to, if it did), or without it when
    tile is None or the main tile."""
    header = f"[{_kind_table(family, kind, arch, head_dim)}.{mask}]"
    body = "".join(f"{key} = {_toml(getattr(tile, key))}\n" for key in main.keys()
                   if getattr(tile, key) != getattr(main, key)) if tile not in (None, main) else None
    kept_to = re.search(rf"^{re.escape(header)}\n(?:[a-z_]+\s*=.*\n)*?({SCORE_MODS_KEY}\s*=.*)$",
                        config_text, re.MULTILINE)
    if body is not None and kept_to:
        body += kept_to.group(1) + "\n"
    return _set_table(config_text, header, body)
