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

from codegen.spec import KernelSpec

ELEMENT_TYPES = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
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
    family = spec.family_record
    template = _environment(family.template_dir).get_template(family.kind(spec.kind).template)
    return template.render(spec=spec, element_type=ELEMENT_TYPES[spec.dtype],
                           mask_type=spec.mask_kind.cpp_type,
                           score_mod_type=spec.score_mod_kind.cpp_type,
                           dropout_type=spec.dropout_type,
                           **_variant_context(spec), **family.template_context(spec))


def _variant_context(spec: KernelSpec) -> dict:
    """A config-defined variant's struct (after the launch header) and, for its mask, the entry
    that fills the mask's block ranges (common/variant.cuh), which the binding calls as
    `attention`."""
    variant = spec.variant
    if variant is None:
        return {"variant_code": "", "variant_entry": ""}
    entry = ""
    if spec.computes_mask_ranges:
        entry = (
            "\n// The variant's mask ranges (common/variant.cuh), before its kernels run.\n"
            "extern \"C\" int flashgen_mask_ranges(const flashgen::AttentionParams* params, "
            "void* stream) {\n"
            f"  return int(flashgen::compute_mask_ranges<{variant.struct}>(*params, "
            "static_cast<cudaStream_t>(stream)));\n}\n")
    return {"variant_code": '#include "flashgen/common/variant.cuh"\n\n' + variant.cpp(),
            "variant_entry": entry}


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
