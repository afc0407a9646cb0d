"""build.ninja as a pure function of what to build and with which tools."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelTarget:
    name: str          # the spec name; the .so exports a launcher of this name
    source: Path
    obj: Path
    lib: Path
    gencode: str
    # Split (common/launch.cuh): the device code and the launch code as two compiles in
    # parallel, the cubin linked into the library through `embed`, a source of its own.
    split: bool = False

    @property
    def cubin(self) -> Path:
        return self.obj.with_suffix(".cubin")

    @property
    def embed(self) -> Path:
        return self.obj.with_name(self.obj.stem + "-device.cpp")

    @property
    def embed_obj(self) -> Path:
        return self.obj.with_name(self.obj.stem + "-device.o")


def embed_source(cubin: Path) -> str:
    """A host source whose object holds `cubin` as flashgen_device_code (common/launch.cuh),
    hidden so that each kernel library keeps its own."""
    path = str(cubin).replace("\\", "\\\\").replace('"', '\\"')
    lines = [".section .rodata", ".balign 128", ".globl flashgen_device_code",
             ".hidden flashgen_device_code", ".type flashgen_device_code, @object",
             "flashgen_device_code:", f'.incbin "{path}"', ".previous"]
    body = "".join(f"    {json.dumps(line + chr(10))}\n" for line in lines)
    return f"// The device code of a split build (codegen/ninja.py).\n__asm__(\n{body});\n"


def _escape(path: Path | str) -> str:
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def kernel_ninja(targets: list[KernelTarget], nvcc: str, nvcc_flags: list[str],
                 include_dirs: list[Path], objects_only: bool = False) -> str:
    """Each kernel: nvcc -c to an object, then linked alone into a shared library; a split one
    compiles its device code (-cubin) and its launch code apart, then links both."""
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
        "rule device",
        "  command = $nvcc $nvcc_flags $gencode $includes -cubin $in -o $out",
        "  description = nvcc $name",
        "",
        "rule launcher",
        "  command = $nvcc $nvcc_flags $gencode $includes -DFLASHGEN_LAUNCH_ONLY -c $in -o $out",
        "  description = launcher $name",
        "",
        "rule embed",
        "  command = $nvcc -Xcompiler=-fPIC -c $in -o $out",
        "  description = embed $name",
        "",
        "rule link",
        "  command = $nvcc -shared $gencode $in -o $out",
        "  description = link $name",
        "",
    ]
    defaults = []
    for t in sorted(targets, key=lambda t: t.name):
        variables = [f"  gencode = {t.gencode}", f"  name = {t.name}"]
        if t.split:
            lines += [f"build {_escape(t.cubin)}: device {_escape(t.source)}", *variables,
                      f"build {_escape(t.obj)}: launcher {_escape(t.source)}", *variables,
                      f"build {_escape(t.embed_obj)}: embed {_escape(t.embed)} | "
                      f"{_escape(t.cubin)}", *variables]
            objects = [t.obj, t.embed_obj]
        else:
            lines += [f"build {_escape(t.obj)}: compile {_escape(t.source)}", *variables]
            objects = [t.obj]
        if objects_only:
            defaults += [_escape(o) for o in objects]
        else:
            lines += [f"build {_escape(t.lib)}: link {' '.join(_escape(o) for o in objects)}",
                      *variables]
            defaults.append(_escape(t.lib))
        lines.append("")
    lines.append("default " + " ".join(defaults))
    return "\n".join(lines) + "\n"


def host_module_ninja(source: Path, output: Path, cxx: str, cxx_flags: list[str],
                      include_dirs: list[Path], libraries: list[str] = ()) -> str:
    """A Python extension module from one C++ source (the binding, the replay): host compiler
    only, no nvcc."""
    includes = " ".join(f"-I{_escape(d)}" for d in include_dirs)
    return "\n".join([
        "ninja_required_version = 1.3",
        "rule cxx",
        f"  command = {cxx} {' '.join(cxx_flags)} {includes} $in -o $out {' '.join(libraries)}",
        "  description = c++ module",
        f"build {_escape(output)}: cxx {_escape(source)}",
        f"default {_escape(output)}",
    ]) + "\n"
