"""The build cache's format: found and verified here on a kernel's first call in a process,
published here by the build (codegen/build.py), so that one module reads and writes it. Nothing
here renders or imports Jinja.

Layout (root: codegen.paths.cache_dir()):
    <arch>/<spec name>-<key>/kernel.so + meta.json   one published entry per spec and key
    <arch>/.build/                                   ninja's working folder (never loaded from)
    <arch>/.lock                                     held while building that arch
    binding/py<major><minor>-<key>/                  the pybind11 binding of one Python
    replay/py<major><minor>-<key>/                   the compiled replay of known calls (one
                                                     Python and torch)
An entry's key is input_key (every input of the spec's render and compile but the compiler: see
there) and the nvcc version. Entries are published by an atomic rename and verified (size and
sha256) before they are loaded, so a killed build or a truncated file is rebuilt, never loaded.

Kernel packages (`flashgen pack`, flashgen/tools/pack.py) hold entries in the same layout under
their package folder, <package>/<arch>/<spec name>-<key>/, and name that folder's package in the
"flashgen.kernels" entry-point group; an entry the cache lacks is looked up there, by input_key
(whichever nvcc built it), verified alike, and never written to.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from codegen import context, paths
from codegen.arch import ARCHS
from codegen.spec import KernelSpec

# The flags every kernel compiles with; part of each entry's key. -Xptxas=-v: registers and
# spills of every kernel land in its entry's meta.json.
NVCC_FLAGS = ["-std=c++17", "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-DNDEBUG",
              "-lineinfo", "-Xcompiler=-fPIC", "-Xptxas=-v"]
LIB_NAME = "kernel.so"
META_NAME = "meta.json"
# The renderer's own code (how it turns a template and its variables into a source) is an input
# of every render: read as a file, never imported.
RENDERER_SOURCE = paths.PACKAGE_DIR / "render.py"

BINDING_SOURCE = paths.TEMPLATES_DIR / "binding.cpp"
CXX_FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden"]
REPLAY_SOURCE = paths.TEMPLATES_DIR / "replay.cpp"
# torch's headers need C++20's bit-field initialisers from torch 2.13 on.
REPLAY_FLAGS = ["-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-w"]


@dataclass(frozen=True)
class Entry:
    spec: KernelSpec
    path: Path  # the entry folder

    @property
    def lib(self) -> Path:
        return self.path / LIB_NAME

    @property
    def resources(self) -> dict:
        """ptxas's report: registers, spill_bytes, stack_bytes (empty if unknown)."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            return json.loads((self.path / META_NAME).read_text())["resources"]
        return {}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_INCLUDE = re.compile(r'^\s*#\s*include\s+"(flashgen/[^"]+)"', re.MULTILINE)
# A Jinja template naming another ({% include "x" %}, extends, import, from): its text is an
# input of the render too.
_TEMPLATE_REFERENCE = re.compile(r'{%-?\s*(?:include|extends|import|from)\s+"([^"]+)"')


@functools.cache
def _header_closure(header: str) -> frozenset[str]:
    """This flashgen header and every flashgen header it includes, transitively."""
    found = {header}
    for name in _INCLUDE.findall((paths.INCLUDE_DIR / header).read_text()):
        found |= _header_closure(name)
    return frozenset(found)


def included_headers(*texts: str) -> set[str]:
    """The flashgen headers that the texts include, transitively. An include inside a template's
    {% if %} counts whether or not a spec takes that branch: a spec's key covers at least the
    headers its rendered source includes."""
    named = {name for text in texts for name in _INCLUDE.findall(text)}
    return set().union(*(_header_closure(name) for name in named))


def headers_digest(headers: set[str]) -> str:
    """The headers by name and content (CUTLASS's are covered by its version): a change to the
    backward's headers leaves forward kernels cached."""
    h = hashlib.sha256()
    for name in sorted(headers):
        h.update(name.encode() + b"\0" + (paths.INCLUDE_DIR / name).read_bytes() + b"\0")
    return h.hexdigest()


def _template_texts(folder: Path, name: str, seen: dict[str, str]) -> dict[str, str]:
    """The template `name` and those it names, transitively, by name (relative to folder)."""
    if name not in seen:
        seen[name] = (folder / name).read_text()
        for other in _TEMPLATE_REFERENCE.findall(seen[name]):
            _template_texts(folder, other, seen)
    return seen


@functools.cache
def cutlass_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def nvcc_version() -> str | None:
    nvcc = paths.nvcc_path()
    if nvcc is None:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def gencode(spec: KernelSpec) -> str:
    """The spec's target and its family's own flags."""
    family = spec.family_record
    return " ".join([family.gencode(ARCHS[spec.arch]), *family.nvcc_flags])


def render_inputs(spec: KernelSpec) -> tuple[dict[str, str], dict]:
    """What a render of the spec reads beside the spec itself: its template and those it names,
    transitively, by name, and its variables (codegen/context.py)."""
    folder, name = context.template(spec)
    return _template_texts(folder, name, {}), context.variables(spec)


def render_input_headers(spec: KernelSpec) -> set[str]:
    """The flashgen headers the spec's templates and variables (a variant's code) include."""
    templates, variables = render_inputs(spec)
    texts = [*templates.values(), *(v for v in variables.values() if isinstance(v, str))]
    return included_headers(*texts)


def input_key(spec: KernelSpec) -> str:
    """Everything that determines the spec's binary except the compiler, from the renderer's
    inputs rather than its output: the spec's identity (its tile and a config-defined variant's
    snippets among it), the template file(s) it renders and the variables it renders them with
    (codegen/context.py), the renderer's source, the flashgen headers all of these include,
    transitively, the CUTLASS version, the flags and the gencode."""
    templates, variables = render_inputs(spec)
    parts = [repr(spec), *(f"{n}\0{text}" for n, text in sorted(templates.items())),
             json.dumps(variables, sort_keys=True), RENDERER_SOURCE.read_text(),
             headers_digest(render_input_headers(spec)), cutlass_version(), " ".join(NVCC_FLAGS),
             gencode(spec)]
    return _sha256("\0".join(parts).encode())


def entry_key(spec: KernelSpec, nvcc: str) -> str:
    return _sha256(f"{input_key(spec)}\0{nvcc}".encode())[:16]


def arch_dir(arch: str) -> Path:
    return paths.cache_dir() / arch


def entry_path(spec: KernelSpec, nvcc: str) -> Path:
    """Where the spec's entry built by this nvcc is (or will be) published."""
    return arch_dir(spec.arch) / f"{spec.name}-{entry_key(spec, nvcc)}"


def _valid(entry_path: Path) -> bool:
    """The entry is complete and its library is the one that was published."""
    try:
        meta = json.loads((entry_path / META_NAME).read_text())
        lib = entry_path / LIB_NAME
        return lib.stat().st_size == meta["size"] and _file_sha256(lib) == meta["sha256"]
    except (OSError, ValueError, KeyError):
        return False


def find_entry(spec: KernelSpec) -> Entry | None:
    """The verified entry of this spec, if built: in the cache (without nvcc, on a machine that
    only runs kernels, one built from the same inputs by any nvcc), else in a kernel package."""
    nvcc = nvcc_version()
    candidates = ([entry_path(spec, nvcc)] if nvcc is not None
                  else _entries_of_inputs(arch_dir(spec.arch), spec))
    for path in candidates:
        if path.is_dir():
            if _valid(path):
                return Entry(spec, path)
            _discard(path)  # corrupted or truncated: rebuilt by the next build
    for root in package_roots().values():
        for path in _entries_of_inputs(root / spec.arch, spec):
            if _valid(path):  # a package's files are its installer's: never discarded here
                return Entry(spec, path)
    return None


def _entries_of_inputs(folder: Path, spec: KernelSpec) -> list[Path]:
    """The entries of the spec under folder built from its inputs (any nvcc), newest first."""
    wanted = input_key(spec)
    found = []
    for path in sorted(folder.glob(f"{spec.name}-*"), key=lambda p: p.stat().st_mtime,
                       reverse=True):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads((path / META_NAME).read_text())["input_key"] == wanted:
                found.append(path)
    return found


PACKAGE_ENTRY_POINTS = "flashgen.kernels"


@functools.cache
def package_roots() -> dict[str, Path]:
    """{distribution name: folder} of the installed kernel packages, found without importing
    them."""
    import importlib.util

    roots = {}
    for point in importlib.metadata.entry_points(group=PACKAGE_ENTRY_POINTS):
        with contextlib.suppress(ImportError, ValueError):
            found = importlib.util.find_spec(point.value)
            if found is not None and found.submodule_search_locations:
                name = point.dist.name if point.dist is not None else point.name
                roots[name] = Path(list(found.submodule_search_locations)[0])
    return roots


def package_of(entry: Entry) -> str | None:
    """The kernel package an entry comes from, or None for the cache's own."""
    for name, root in package_roots().items():
        if entry.path.is_relative_to(root):
            return name
    return None


def _discard(path: Path) -> None:
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    with contextlib.suppress(OSError):
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)


def publish(spec: KernelSpec, built_lib: Path, nvcc: str, resources: dict) -> Entry:
    """Copies a freshly built library into a temporary folder beside its entry, writes the meta
    that find_entry verifies it by, and renames the folder into place."""
    final = entry_path(spec, nvcc)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.name}-", dir=final.parent))
    shutil.copyfile(built_lib, tmp / LIB_NAME)
    meta = {"name": spec.name, "input_key": input_key(spec), "nvcc": nvcc,
            "size": (tmp / LIB_NAME).stat().st_size, "sha256": _file_sha256(tmp / LIB_NAME),
            "resources": resources}
    (tmp / META_NAME).write_text(json.dumps(meta, indent=1) + "\n")
    try:
        tmp.rename(final)
    except OSError:  # an entry appeared meanwhile (another cache root sharing the folder)
        shutil.rmtree(tmp, ignore_errors=True)
    return Entry(spec, final)


def binding_path() -> Path:
    """Where the pybind11 module for this Python is, once built (codegen/build.py's
    build_binding): keyed by its source and headers, the Python and pybind11 versions, the C++
    compiler and its flags."""
    import sysconfig

    import pybind11  # a dependency of the binding alone

    source = BINDING_SOURCE.read_text()
    cxx = os.environ.get("CXX", "c++")
    key = _sha256("\0".join([source, headers_digest(included_headers(source)), sys.version,
                             pybind11.__version__, cxx, " ".join(CXX_FLAGS)]).encode())[:16]
    folder = paths.cache_dir() / "binding" / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    return folder / f"_flashgen_binding{sysconfig.get_config_var('EXT_SUFFIX')}"


def replay_path() -> Path:
    """Where the compiled replay of known calls (flashgen/replay.py) is, once built
    (codegen/build.py's build_replay): keyed by its source, the Python and torch versions (it
    is built against torch's headers and libraries), the C++ compiler and its flags."""
    import sysconfig

    import torch

    cxx = os.environ.get("CXX", "c++")
    key = _sha256("\0".join([REPLAY_SOURCE.read_text(), sys.version, torch.__version__,
                             str(torch.version.cuda), cxx, " ".join(REPLAY_FLAGS)]).encode())[:16]
    folder = paths.cache_dir() / "replay" / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    return folder / f"_flashgen_replay{sysconfig.get_config_var('EXT_SUFFIX')}"
