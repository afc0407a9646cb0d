"""Build kernels into the content-hashed cache (its format, keys and lookup: flashgen/cache.py):
render the missing specs, one ninja run per arch under a lock, publish each built library.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from codegen import ninja, paths, variants
from codegen.render import render_spec, write_if_changed
from codegen.spec import KernelSpec
from flashgen import cache

LOCK_TIMEOUT_S = float(os.environ.get("FLASHGEN_LOCK_TIMEOUT", "3600"))


class BuildError(RuntimeError):
    """A build failed; the message carries the compiler's output and command line."""


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


def _die_with_parent() -> None:
    """Linux: a build whose Python process is killed stops instead of running on unowned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


# Measured per kernel and core: 21-36 s for one translation unit (nvcc 13.0).
SECONDS_PER_KERNEL_AND_CORE = 30


def run_ninja(build_dir: Path, jobs: int | None, log: Callable[[str], None],
              kernels: int = 0) -> tuple[bool, str, dict[str, str]]:
    """Runs ninja. With `kernels` (the nvcc edges it runs), logs a line per compiled kernel with
    the count and an estimate of the time left (link steps are not counted); else ninja's own
    progress lines. Returns success, the whole output, and each edge's own output keyed by the
    last word of its description (the spec name)."""
    ninja_bin = shutil.which("ninja")
    if ninja_bin is None:
        raise BuildError("ninja not found: install it with `pip install ninja`")
    cmd = [ninja_bin, "-C", str(build_dir), "-k", "0"]
    if jobs:
        cmd += ["-j", str(jobs)]
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, preexec_fn=_die_with_parent)
    lines, per_edge, current, compiled, start = [], {}, None, 0, time.monotonic()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("["):
            words = line.split()
            current = words[-1] if words[-2:-1] == ["nvcc"] else None
            if not kernels:
                log(line.rstrip())
            elif current is not None:
                compiled += 1
                elapsed = time.monotonic() - start
                left = elapsed / compiled * (kernels - compiled)
                log(f"[{compiled}/{kernels} kernels, {elapsed:.0f}s, about {left:.0f}s left] "
                    f"{current}")
        elif current is not None:
            per_edge[current] = per_edge.get(current, "") + line
    return proc.wait() == 0, "".join(lines), per_edge


def split_build(kernels: int, cores: int) -> bool:
    """Whether to compile each kernel's device code and launch code apart (common/launch.cuh):
    it shortens one kernel's build by the launch code's share (the host compiler's passes) and
    costs more compiler work in all, so it pays where cores would idle, a first call's build;
    FLASHGEN_SPLIT_BUILD=1 or 0 decides for every build."""
    forced = os.environ.get("FLASHGEN_SPLIT_BUILD")
    if forced in ("0", "1"):
        return forced == "1"
    return 2 * kernels <= cores


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
          log: Callable[[str], None] = print) -> list[cache.Entry]:
    """Builds the specs not yet in the cache (all of one arch per ninja run) and returns the
    entries of all of them. objects_only compiles to object files and publishes nothing (CI's
    template check); it returns no entries."""
    nvcc_bin = paths.nvcc_path()
    nvcc = cache.nvcc_version()
    if nvcc_bin is None or nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit (12.x or 13.x) and put nvcc on "
                         "PATH or set CUDA_HOME")
    check_variants(specs, nvcc_bin)
    entries = []
    for arch in sorted({s.arch for s in specs}):
        arch_specs = sorted(s for s in specs if s.arch == arch)
        entries += _build_arch(arch, arch_specs, nvcc_bin, nvcc, jobs, objects_only, log)
    return entries


def _build_arch(arch, specs, nvcc_bin, nvcc, jobs, objects_only, log) -> list[cache.Entry]:
    root = cache.arch_dir(arch)
    with cache_lock(root / ".lock", log=log):
        found = {s: None if objects_only else cache.find_entry(s) for s in specs}
        missing = [s for s, e in found.items() if e is None]
        if not missing:
            return [e for e in found.values() if e is not None]
        build_dir = root / ".build"
        cores = jobs or os.cpu_count() or 1
        split = not objects_only and split_build(len(missing), cores)  # (an object per kernel)
        targets = []
        for spec in missing:
            key = cache.entry_key(spec, nvcc)
            source = build_dir / "src" / f"{spec.name}.cu"
            # Rewritten only where it changed: ninja then keeps what a killed build finished.
            write_if_changed(source, render_spec(spec))
            target = ninja.KernelTarget(
                name=spec.name, source=source, obj=build_dir / "obj" / f"{spec.name}-{key}.o",
                lib=build_dir / "lib" / f"{spec.name}-{key}.so", gencode=cache.gencode(spec),
                split=split)
            if split:
                write_if_changed(target.embed, ninja.embed_source(target.cubin))
            targets.append(target)
        (build_dir / "build.ninja").write_text(ninja.kernel_ninja(
            targets, nvcc_bin, cache.NVCC_FLAGS, [paths.INCLUDE_DIR, paths.cutlass_include_dir()],
            objects_only=objects_only))
        estimate = SECONDS_PER_KERNEL_AND_CORE * -(-len(missing) // cores)
        log(f"flashgen: compiling {len(missing)} kernel(s) for {arch} "
            f"({len(specs) - len(missing)} already cached): about {estimate} s on {cores} "
            f"core(s), {SECONDS_PER_KERNEL_AND_CORE} s per kernel per core")
        start = time.monotonic()
        ok, output, reports = run_ninja(build_dir, jobs, log, kernels=len(missing))
        if objects_only:
            if not ok:
                raise BuildError(f"nvcc failed for {arch}:\n{output}")
            return []
        for target, spec in zip(targets, missing):
            if target.lib.is_file():
                found[spec] = cache.publish(spec, target.lib, nvcc,
                                            parse_ptxas(reports.get(spec.name, "")))
        if not ok:
            failed = [s.name for s in missing if found[s] is None]
            raise BuildError(f"flashgen: {len(failed)} kernel(s) failed to build for {arch}: "
                             f"{', '.join(failed)}\n{output}")
        log(f"flashgen: built {len(missing)} kernel(s) for {arch} in "
            f"{time.monotonic() - start:.0f}s -> {root}")
        return [found[s] for s in specs]


def build_binding(log: Callable[[str], None] = print) -> Path:
    """The pybind11 module for this Python; built once (seconds), cached like the kernels."""
    import sysconfig

    import pybind11

    includes = [Path(pybind11.get_include()), Path(sysconfig.get_paths()["include"]),
                paths.INCLUDE_DIR]
    return _build_host_module(cache.binding_path(), cache.BINDING_SOURCE, cache.CXX_FLAGS,
                              includes, [], "the binding", "once per Python version", log)


def build_replay(log: Callable[[str], None] = print) -> Path:
    """The compiled replay of known calls (templates/replay.cpp) for this Python and torch,
    against torch's headers and libraries and the CUDA runtime of the toolkit nvcc is in;
    built once (seconds)."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    nvcc = paths.nvcc_path()
    if nvcc is None:
        raise BuildError("flashgen: the replay of known calls needs the CUDA toolkit's headers "
                         "and runtime: put nvcc on PATH or set CUDA_HOME")
    toolkit = Path(nvcc).resolve().parent.parent
    flags = [*cache.REPLAY_FLAGS,
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    includes = [Path(sysconfig.get_paths()["include"]), *map(Path, cpp_extension.include_paths()),
                toolkit / "include"]
    libraries = [arg for d in (*cpp_extension.library_paths(), toolkit / "lib64")
                 for arg in (f"-L{d}", f"-Wl,-rpath,{d}")]
    libraries += ["-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_python", "-lcudart"]
    return _build_host_module(cache.replay_path(), cache.REPLAY_SOURCE, flags, includes,
                              libraries, "the replay of known calls", "once per torch version",
                              log)


def _build_host_module(module: Path, source: Path, flags: list[str], includes: list[Path],
                       libraries: list[str], name: str, once: str,
                       log: Callable[[str], None]) -> Path:
    """A Python extension module from one C++ source with the host compiler, published into
    its cache folder by an atomic rename."""
    final = module.parent
    root = final.parent
    if module.is_file():
        return module
    with cache_lock(root / ".lock", log=log):
        if module.is_file():
            return module
        build_dir = root / ".build"
        build_dir.mkdir(parents=True, exist_ok=True)
        output = build_dir / f"{final.name}-{module.name}"
        (build_dir / "build.ninja").write_text(
            ninja.host_module_ninja(source, output, os.environ.get("CXX", "c++"), flags,
                                    includes, libraries))
        log(f"flashgen: compiling {name} ({once})")
        ok, out, _ = run_ninja(build_dir, None, log)
        if not ok:
            raise BuildError(f"flashgen: {name} failed to build:\n{out}")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-module-", dir=root))
        shutil.copyfile(output, tmp / module.name)
        try:
            tmp.rename(final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return module
