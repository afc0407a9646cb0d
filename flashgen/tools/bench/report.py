"""The result document: its schema (and older documents upgraded to it), the screen line of a
cell, the Markdown tables and the plots. Needs no GPU: a run's JSON reports on any machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

from flashgen.tools.bench.grid import (FA4, FLOP_FACTOR, KNOWN_IMPLEMENTATIONS, MAIN_TILE,
                                       MODE_NAMES, MODES, PEER, mode_flops)

SCHEMA_VERSION = 2  # 2: cells of every mode, results may be {"unsupported": why}
# A flashgen result where the forward is timed also names the forward tile that ran ("tile").
RESULT_FORMS = ({"ms", "tflops"}, {"ms", "tflops", "tile"}, {"error"}, {"unsupported"})
# "causal" stays a bool in the cells (committed results use it); flashgen's mask is "causal" or
# "none" accordingly.
CELL_KEYS = {"mode", "dtype", "head_dim", "causal", "seqlen", "batch", "heads", "flops", "results"}
# Implementations' earlier names, as documents may hold them -> their names now.
RENAMED_IMPLEMENTATIONS = {"flashgen_variant_tile": "flashgen_alt_tile"}


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
    against_fa4 = ratio(cell, peer=FA4)
    if against_fa4:
        parts.append(f"flashgen/{FA4} {against_fa4:.2f}x")
    gain = ratio(cell, peer=MAIN_TILE)
    if gain:
        parts.append(f"flashgen/{MAIN_TILE} {gain:.2f}x")
    return "  ".join(parts)


def upgraded(result: dict) -> dict:
    """A results document in the current schema: version 1 held forward cells only; renamed
    implementations take their current names."""
    if not isinstance(result.get("cells"), list):
        return result
    cells = result["cells"]
    if result.get("schema") == 1:
        cells = [{**cell, "mode": "fwd"} for cell in cells]
        result = {**result, "schema": SCHEMA_VERSION}
    cells = [_renamed(cell) for cell in cells]
    return {**result, "cells": cells}


def _renamed(cell: dict) -> dict:
    results = cell.get("results")
    if not isinstance(results, dict) or not set(results) & set(RENAMED_IMPLEMENTATIONS):
        return cell
    return {**cell, "results": {RENAMED_IMPLEMENTATIONS.get(name, name): value
                                for name, value in results.items()}}


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
             "flashgen / FLASH_ATTENTION (FlashAttention-2), vs FA4 (where it ran) flashgen / "
             "FlashAttention-4, vs main tile (when timed) flashgen / flashgen_main_tile. n/a: "
             "did not run (out of memory, or no kernel for the shape); unsupported: the "
             "implementation lacks that mode, or is not installed.", ""]
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
    ran = {name for cell in cells for name, result in cell["results"].items()
           if "tflops" in result}
    peers = ({PEER: "ratio"} | ({FA4: "vs FA4"} if FA4 in ran else {})
             | ({MAIN_TILE: "vs main tile"} if MAIN_TILE in impls else {}))
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
