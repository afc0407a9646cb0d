"""Build-or-find compiled kernels in the content-hashed cache.

Cache layout (root: codegen.paths.cache_dir()):
    <arch>/<spec name>-<key>/kernel.so + meta.json   one published entry per spec and key
    <arch>/.build/                                   ninja's working folder (never loaded from)
    <arch>/.lock                                     held while building that arch
The key hashes the rendered source, every flashgen header, the CUTLASS version, the flags and
the nvcc version. Entries are published by an atomic rename and verified (size and sha256)
before they are loaded, so a killed build or a truncated file is rebuilt, never loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from codegen import ninja, paths, variants
from codegen.arch import ARCHS
from codegen.render import render_spec
from codegen.spec import KernelSpec

# -Xptxas=-v: registers and spills of every kernel land in its cache entry (meta.json).
NVCC_FLAGS = ["-std=c++17", "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-DNDEBUG",
              "-lineinfo", "-Xcompiler=-fPIC", "-Xptxas=-v"]
LOCK_TIMEOUT_S = float(os.environ.get("FLASHGEN_LOCK_TIMEOUT", "3600"))
LIB_NAME = "kernel.so"


class BuildError(RuntimeError):
    """A build failed; the message carries the compiler's output and command line."""


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
            return json.loads((self.path / "meta.json").read_text())["resources"]
        return {}


def parse_ptxas(report: str) -> dict:
    """The worst registers / spill stores / stack frame over the kernels of one ptxas -v report,
    and whether ptxas serialised wgmma instructions for want of registers (C7512, an info line
    that --warning-as-error does not stop, on a kernel that runs but loses much of its speed)."""
    def largest(pattern: str) -> int:
        return max((int(m) for m in re.findall(pattern, report)), default=0)

    return {"registers": largest(r"Used (\d+) registers"),
            "spill_bytes": largest(r"(\d+) bytes spill stores"),
            "stack_bytes": largest(r"(\d+) bytes stack frame"),
            "wgmma_serialised": "C7512" in report}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_INCLUDE = re.compile(r'^\s*#\s*include\s+"(flashgen/[^"]+)"', re.MULTILINE)


@functools.cache
def _header_closure(header: str) -> frozenset[str]:
    """This flashgen header and every flashgen header it includes, transitively."""
    found = {header}
    for name in _INCLUDE.findall((paths.INCLUDE_DIR / header).read_text()):
        found |= _header_closure(name)
    return frozenset(found)


def headers_digest(source: str) -> str:
    """The flashgen headers `source` includes, transitively, by name and content (CUTLASS's are
    covered by its version). A change to the backward's headers leaves forward kernels cached."""
    h = hashlib.sha256()
    headers = set().union(*(_header_closure(name) for name in _INCLUDE.findall(source)))
    for name in sorted(headers):
        h.update(name.encode() + b"\0" + (paths.INCLUDE_DIR / name).read_bytes() + b"\0")
    return h.hexdigest()


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


def source_key(spec: KernelSpec) -> str:
    """Everything that determines the binary except the compiler."""
    source = render_spec(spec)
    parts = [source, headers_digest(source), cutlass_version(), " ".join(NVCC_FLAGS),
             gencode(spec)]
    return _sha256("\0".join(parts).encode())


def gencode(spec: KernelSpec) -> str:
    """The spec's target and its family's own flags."""
    family = spec.family_record
    return " ".join([family.gencode(ARCHS[spec.arch]), *family.nvcc_flags])


def entry_key(spec: KernelSpec, nvcc: str) -> str:
    return _sha256(f"{source_key(spec)}\0{nvcc}".encode())[:16]


def arch_dir(arch: str) -> Path:
    return paths.cache_dir() / arch


def _valid(entry_path: Path) -> bool:
    """The entry is complete and its library is the one that was published."""
    try:
        meta = json.loads((entry_path / "meta.json").read_text())
        lib = entry_path / LIB_NAME
        return lib.stat().st_size == meta["size"] and _file_sha256(lib) == meta["sha256"]
    except (OSError, ValueError, KeyError):
        return False


def find_entry(spec: KernelSpec) -> Entry | None:
    """The verified cache entry of this spec, if built. Without nvcc (a machine that only runs
    kernels), any entry built from the same sources by any nvcc is accepted."""
    nvcc = nvcc_version()
    if nvcc is not None:
        candidates = [arch_dir(spec.arch) / f"{spec.name}-{entry_key(spec, nvcc)}"]
    else:
        wanted = source_key(spec)
        candidates = []
        for path in sorted(arch_dir(spec.arch).glob(f"{spec.name}-*"),
                           key=lambda p: p.stat().st_mtime, reverse=True):
            with contextlib.suppress(OSError, ValueError, KeyError):
                if json.loads((path / "meta.json").read_text())["source_key"] == wanted:
                    candidates.append(path)
    for path in candidates:
        if path.is_dir():
            if _valid(path):
                return Entry(spec, path)
            _discard(path)  # corrupted or truncated: rebuilt by the next build
    return None


def _discard(path: Path) -> None:
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    with contextlib.suppress(OSError):
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(path: Path, timeout: float = LOCK_TIMEOUT_S,
               log: Callable[[str], None] = print) -> Iterator[None]:
    """An exclusive flock: released by the kernel when the holder dies, so never stale."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"flashgen: gave up after {timeout:.0f}s waiting for the build lock {path} "
                        f"(held by pid {holder}); if that process is gone, delete the file") from None
                if not waited:
                    log(f"flashgen: waiting for another build (pid {holder}) holding {path}")
                    waited = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _publish(spec: KernelSpec, built_lib: Path, final: Path, nvcc: str, report: str) -> Entry:
    """Copies the library into a temporary folder beside the entry and renames it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.name}-", dir=final.parent))
    shutil.copyfile(built_lib, tmp / LIB_NAME)
    meta = {"name": spec.name, "source_key": source_key(spec), "nvcc": nvcc,
            "size": (tmp / LIB_NAME).stat().st_size, "sha256": _file_sha256(tmp / LIB_NAME),
            "resources": parse_ptxas(report)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    try:
        tmp.rename(final)
    except OSError:  # an entry appeared meanwhile (another cache root sharing the folder)
        shutil.rmtree(tmp, ignore_errors=True)
    return Entry(spec, final)


def _die_with_parent() -> None:
    """Linux: a build whose Python process is killed stops instead of running on unowned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def run_ninja(build_dir: Path, jobs: int | None,
              log: Callable[[str], None]) -> tuple[bool, str, dict[str, str]]:
    """Runs ninja, logging its progress lines. Returns success, the whole output, and each
    edge's own output keyed by the last word of its description (the spec name)."""
    ninja_bin = shutil.which("ninja")
    if ninja_bin is None:
        raise BuildError("ninja not found: install it with `pip install ninja`")
    cmd = [ninja_bin, "-C", str(build_dir), "-k", "0"]
    if jobs:
        cmd += ["-j", str(jobs)]
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, preexec_fn=_die_with_parent)
    lines, per_edge, current = [], {}, None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("["):
            log(line.rstrip())
            words = line.split()
            current = words[-1] if words[-2:-1] == ["nvcc"] else None
        elif current is not None:
            per_edge[current] = per_edge.get(current, "") + line
    return proc.wait() == 0, "".join(lines), per_edge


def check_variants(specs: list[KernelSpec], nvcc_bin) -> None:
    """Compiles each config-defined variant of the specs alone (codegen/variants.py's
    check_source, a few seconds each): an invalid snippet raises BuildError with the compiler's
    message and the variant's table before any kernel builds."""
    for variant in sorted({s.variant for s in specs if s.variant is not None}):
        with tempfile.TemporaryDirectory(prefix="flashgen-variant-") as tmp:
            source = Path(tmp) / f"{variant.name}.cu"
            source.write_text(variants.check_source(variant))
            result = subprocess.run(
                [str(nvcc_bin), "-std=c++17", "-c", "-o", str(Path(tmp) / "check.o"),
                 f"-I{paths.INCLUDE_DIR}", str(source)], capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"flashgen: config table [variants.{variant.name}] does not compile "
                             f"(its mask_mod, score_mod or score_mod_grad):\n"
                             f"{(result.stdout + result.stderr).strip()}")


def build(specs: list[KernelSpec], jobs: int | None = None, objects_only: bool = False,
          log: Callable[[str], None] = print) -> list[Entry]:
    """Builds the specs not yet in the cache (all of one arch per ninja run) and returns the
    entries of all of them. objects_only compiles to object files and publishes nothing (CI's
    template check); it returns no entries."""
    nvcc_bin = paths.nvcc_path()
    nvcc = nvcc_version()
    if nvcc_bin is None or nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit (12.x or 13.x) and put nvcc on "
                         "PATH or set CUDA_HOME")
    check_variants(specs, nvcc_bin)
    entries = []
    for arch in sorted({s.arch for s in specs}):
        arch_specs = sorted(s for s in specs if s.arch == arch)
        entries += _build_arch(arch, arch_specs, nvcc_bin, nvcc, jobs, objects_only, log)
    return entries


def _build_arch(arch, specs, nvcc_bin, nvcc, jobs, objects_only, log) -> list[Entry]:
    root = arch_dir(arch)
    with cache_lock(root / ".lock", log=log):
        found = {s: find_entry(s) for s in specs} if not objects_only else {s: None for s in specs}
        missing = [s for s, e in found.items() if e is None]
        if not missing:
            return [e for e in found.values() if e is not None]
        build_dir = root / ".build"
        targets = []
        for spec in missing:
            key = entry_key(spec, nvcc)
            source = build_dir / "src" / f"{spec.name}.cu"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(render_spec(spec))
            targets.append(ninja.KernelTarget(
                name=spec.name, source=source, obj=build_dir / "obj" / f"{spec.name}-{key}.o",
                lib=build_dir / "lib" / f"{spec.name}-{key}.so", gencode=gencode(spec)))
        (build_dir / "build.ninja").write_text(ninja.kernel_ninja(
            targets, nvcc_bin, NVCC_FLAGS, [paths.INCLUDE_DIR, paths.cutlass_include_dir()],
            objects_only=objects_only))
        log(f"flashgen: compiling {len(missing)} kernel(s) for {arch} "
            f"({len(specs) - len(missing)} already cached); about a minute per kernel per core")
        start = time.monotonic()
        ok, output, reports = run_ninja(build_dir, jobs, log)
        if objects_only:
            if not ok:
                raise BuildError(f"nvcc failed for {arch}:\n{output}")
            return []
        for target, spec in zip(targets, missing):
            if target.lib.is_file():
                found[spec] = _publish(spec, target.lib, root / f"{spec.name}-{entry_key(spec, nvcc)}",
                                       nvcc, reports.get(spec.name, ""))
        if not ok:
            failed = [s.name for s in missing if found[s] is None]
            raise BuildError(f"flashgen: {len(failed)} kernel(s) failed to build for {arch}: "
                             f"{', '.join(failed)}\n{output}")
        log(f"flashgen: built {len(missing)} kernel(s) for {arch} in "
            f"{time.monotonic() - start:.0f}s -> {root}")
        return [found[s] for s in specs]


BINDING_SOURCE = paths.TEMPLATES_DIR / "binding.cpp"
CXX_FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden"]


def build_binding(log: Callable[[str], None] = print) -> Path:
    """The pybind11 module for this Python; built once (seconds), cached like the kernels."""
    import sysconfig

    import pybind11

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    cxx = os.environ.get("CXX", "c++")
    key = _sha256("\0".join([
        BINDING_SOURCE.read_text(), headers_digest(BINDING_SOURCE.read_text()), sys.version, pybind11.__version__, cxx,
        " ".join(CXX_FLAGS)]).encode())[:16]
    root = paths.cache_dir() / "binding"
    final = root / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    module = final / f"_flashgen_binding{suffix}"
    if module.is_file():
        return module
    with cache_lock(root / ".lock", log=log):
        if module.is_file():
            return module
        build_dir = root / ".build"
        build_dir.mkdir(parents=True, exist_ok=True)
        output = build_dir / f"_flashgen_binding-{key}{suffix}"
        includes = [Path(pybind11.get_include()), Path(sysconfig.get_paths()["include"]),
                    paths.INCLUDE_DIR]
        (build_dir / "build.ninja").write_text(
            ninja.binding_ninja(BINDING_SOURCE, output, cxx, CXX_FLAGS, includes))
        log("flashgen: compiling the Python binding (once per Python version)")
        ok, out, _ = run_ninja(build_dir, None, log)
        if not ok:
            raise BuildError(f"flashgen: the binding failed to build:\n{out}")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-binding-", dir=root))
        shutil.copyfile(output, tmp / module.name)
        try:
            tmp.rename(final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return module
