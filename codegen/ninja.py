"""build.ninja as a pure function of what to build and with which tools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelTarget:
    name: str          # the spec name; the .so exports a launcher of this name
    source: Path
    obj: Path
    lib: Path
    gencode: str


def _escape(path: Path | str) -> str:
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def kernel_ninja(targets: list[KernelTarget], nvcc: str, nvcc_flags: list[str],
                 include_dirs: list[Path], objects_only: bool = False) -> str:
    """Each kernel: nvcc -c to an object, then linked alone into a shared library."""
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {nvcc}",
        f"nvcc_flags = {' '.join(nvcc_flags)}",
        "includes = " + " ".join(f"-I{_escape(d)}" for d in include_dirs),
        "",
        "rule compile",
        "  command = $nvcc $nvcc_flags $gencode $includes -c $in -o $out",
        "  description = nvcc $name",
        "",
        "rule link",
        "  command = $nvcc -shared $gencode $in -o $out",
        "  description = link $name",
        "",
    ]
    defaults = []
    for t in sorted(targets, key=lambda t: t.name):
        lines += [f"build {_escape(t.obj)}: compile {_escape(t.source)}",
                  f"  gencode = {t.gencode}", f"  name = {t.name}"]
        if objects_only:
            defaults.append(_escape(t.obj))
        else:
            lines += [f"build {_escape(t.lib)}: link {_escape(t.obj)}",
                      f"  gencode = {t.gencode}", f"  name = {t.name}"]
            defaults.append(_escape(t.lib))
        lines.append("")
    lines.append("default " + " ".join(defaults))
    return "\n".join(lines) + "\n"


def binding_ninja(source: Path, output: Path, cxx: str, cxx_flags: list[str],
                  include_dirs: list[Path]) -> str:
    """The pybind11 module: host compiler only, no CUDA."""
    includes = " ".join(f"-I{_escape(d)}" for d in include_dirs)
    return "\n".join([
        "ninja_required_version = 1.3",
        "rule cxx",
        f"  command = {cxx} {' '.join(cxx_flags)} {includes} $in -o $out",
        "  description = c++ binding",
        f"build {_escape(output)}: cxx {_escape(source)}",
        f"default {_escape(output)}",
    ]) + "\n"
