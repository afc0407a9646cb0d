"""Specs -> CUDA sources. Deterministic: the same config renders byte-identical files."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2

from codegen.paths import TEMPLATES_DIR
from codegen.spec import KernelSpec

ELEMENT_TYPES = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
MANIFEST = "manifest.json"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


def render_spec(spec: KernelSpec) -> str:
    template = _env.get_template(f"{spec.direction}_kernel_{spec.family}.cu.j2")
    return template.render(spec=spec, element_type=ELEMENT_TYPES[spec.dtype])


def source_path(out_dir: Path, spec: KernelSpec) -> Path:
    return out_dir / spec.arch / f"{spec.name}.cu"


def write_if_changed(path: Path, text: str) -> bool:
    """Writes only when the content differs, so ninja and git see no change otherwise."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def manifest_text(specs: list[KernelSpec]) -> str:
    entries = [
        {"name": s.name, "direction": s.direction, "arch": s.arch, "dtype": s.dtype,
         "head_dim": s.head_dim, "causal": s.causal, "block_m": s.block_m, "block_n": s.block_n,
         "warps": s.warps, "stages": s.stages, "source": f"{s.arch}/{s.name}.cu"}
        for s in sorted(specs)
    ]
    return json.dumps({"kernels": entries}, indent=1) + "\n"


def render_tree(specs: list[KernelSpec], out_dir: Path) -> list[Path]:
    """Renders every spec and the manifest into out_dir and removes sources of specs no longer
    configured. Returns the files that changed."""
    changed = []
    wanted = set()
    for spec in sorted(specs):
        path = source_path(out_dir, spec)
        wanted.add(path)
        if write_if_changed(path, render_spec(spec)):
            changed.append(path)
    for stale in sorted(out_dir.glob("*/*.cu")):
        if stale not in wanted:
            stale.unlink()
            changed.append(stale)
    manifest = out_dir / MANIFEST
    if write_if_changed(manifest, manifest_text(specs)):
        changed.append(manifest)
    return changed
