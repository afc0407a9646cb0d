"""Specs -> CUDA sources. Deterministic: the same config renders byte-identical files."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import tempfile
from pathlib import Path

import jinja2

from codegen import context
from codegen.spec import KernelSpec

# The full list of specs, written beside the samples but not tracked by git (35k lines that every
# config change rewrites); the summary, a few dozen lines, is the reviewed record.
MANIFEST = "manifest.json"
SUMMARY = "summary.md"
# The head dim whose spec stands for its template in generated/ (any configured one will do).
SAMPLE_HEAD_DIM = 128


@functools.cache
def _environment(template_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["cpp"] = lambda value: "true" if value else "false"  # a Python bool in C++
    return env


def render_spec(spec: KernelSpec) -> str:
    folder, name = context.template(spec)
    return _environment(folder).get_template(name).render(spec=spec, **context.variables(spec))


def write_if_changed(path: Path, text: str) -> bool:
    """Writes only when the content differs, so ninja and git see no change otherwise. The new
    text goes to a temporary file of its own first and replaces the old in one step, so that
    concurrent renders into one directory (two `flashgen generate` runs sharing a cache) never
    meet a half-written file or each other's temporary."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".tmp", delete=False) as tmp:
        tmp.write(text)
    os.chmod(tmp.name, 0o644)  # a source file's usual mode, not the temporary's private 0600
    Path(tmp.name).replace(path)
    return True


def manifest_text(specs: list[KernelSpec]) -> str:
    entries = [
        {"name": s.name, "family": s.family, "kind": s.kind, "arch": s.arch, "dtype": s.dtype,
         "head_dim": s.head_dim, "mask": s.mask, "tile": dataclasses.asdict(s.tile)}
        for s in sorted(specs)
    ]
    return json.dumps({"kernels": entries}, indent=1) + "\n"


def summary_text(specs: list[KernelSpec]) -> str:
    """What the config enumerates, short enough to review in a diff: kernels per family, kind and
    arch, then each head dim's tiles."""
    groups = collections.defaultdict(list)
    tiles = collections.defaultdict(set)
    for s in specs:
        groups[s.family, s.kind, s.arch].append(s)
        tiles[s.family, s.kind, s.arch, s.head_dim].add(s.tile.suffix)
    lines = [f"# {len(specs)} kernels", "",
             "Rendered by `flashgen generate --dry-run` (codegen/render.py); the full list is",
             f"{MANIFEST} beside this file, written by the same command and not tracked.", "",
             "| family | kind | arch | head dims | kernels | with dropout | of a config variant |",
             "|---|---|---|---|---|---|---|"]
    for (family, kind, arch), group in sorted(groups.items()):
        head_dims = " ".join(str(d) for d in sorted({s.head_dim for s in group}))
        lines.append(f"| {family} | {kind} | {arch} | {head_dims} | {len(group)} "
                     f"| {sum(s.dropout for s in group)} "
                     f"| {sum(s.variant is not None for s in group)} |")
    lines += ["", "| family | kind | arch | head dim | tiles |", "|---|---|---|---|---|"]
    for (family, kind, arch, head_dim), suffixes in sorted(tiles.items()):
        lines.append(f"| {family} | {kind} | {arch} | {head_dim} | {' '.join(sorted(suffixes))} |")
    return "\n".join(lines) + "\n"


def samples(specs: list[KernelSpec]) -> list[KernelSpec]:
    """One spec per template (family and kind), to show what it renders: the first at
    SAMPLE_HEAD_DIM if there is one, else the first, without a score modifier where there is
    one."""
    chosen = {}
    for spec in sorted(specs, key=lambda s: (s.head_dim != SAMPLE_HEAD_DIM,
                                             s.score_mod != "none", s)):
        chosen.setdefault((spec.family, spec.kind), spec)
    return sorted(chosen.values())


def sample_path(out_dir: Path, spec: KernelSpec) -> Path:
    return out_dir / spec.family / f"{spec.kind}_sample.cu"


def render_tree(specs: list[KernelSpec], out_dir: Path) -> list[Path]:
    """Writes the manifest of every spec, its summary and one rendered sample per template into
    out_dir (a full render of every family would be hundreds of files; the build renders each
    kernel into its cache folder), and removes samples no longer configured. Returns the files
    that changed."""
    changed = []
    wanted = set()
    for spec in samples(specs):
        path = sample_path(out_dir, spec)
        wanted.add(path)
        if write_if_changed(path, render_spec(spec)):
            changed.append(path)
    for stale in sorted(out_dir.glob("**/*.cu")):
        if stale not in wanted:
            stale.unlink()
            changed.append(stale)
    for name, text in ((MANIFEST, manifest_text(specs)), (SUMMARY, summary_text(specs))):
        if write_if_changed(out_dir / name, text):
            changed.append(out_dir / name)
    return changed
