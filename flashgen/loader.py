"""Build-or-load: turns a spec into a callable launcher address, compiling it on first use. A
kernel or binding found in the cache loads without the generator; only a miss imports it
(codegen/build.py: Jinja, ninja, nvcc)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
from dataclasses import dataclass

from codegen import paths
from codegen.spec import KernelSpec
from flashgen import cache

_lock = threading.Lock()
_launchers: dict[KernelSpec, "Launcher"] = {}
_binding = None


@dataclass(frozen=True)
class Launcher:
    spec: KernelSpec
    address: int               # extern "C" int <spec.name>(const FwdParams*, void* stream)
    error_string_address: int  # extern "C" const char* flashgen_error_string(int)
    library: ctypes.CDLL       # keeps the library loaded
    # extern "C" int flashgen_mask_ranges(const AttentionParams*, void* stream) of a
    # config-defined mask's kernels (common/variant.cuh); 0 in others
    mask_ranges_address: int = 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _build():
    """The generator's build, imported on a miss only: a call of a built kernel imports no Jinja
    (tests/test_runtime_imports.py)."""
    from codegen import build

    return build


def binding():
    """The pybind11 module that fills FwdParams and calls a launcher."""
    global _binding
    if _binding is None:
        with _lock:
            if _binding is None:
                path = cache.binding_path()
                if not path.is_file():
                    path = _build().build_binding(log=_log)
                spec = importlib.util.spec_from_file_location("_flashgen_binding", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                _binding = module
    return _binding


def launcher(spec: KernelSpec) -> Launcher:
    found = _launchers.get(spec)
    if found is not None:
        return found
    with _lock:
        if spec not in _launchers:
            _launchers[spec] = _load(spec)
    return _launchers[spec]


def _load(spec: KernelSpec) -> Launcher:
    entry = cache.find_entry(spec)
    if entry is None:
        command = (f"flashgen generate --arch {spec.arch} --head-dim {spec.head_dim} "
                   f"--dtype {spec.dtype}")
        if not paths.jit_enabled():
            raise RuntimeError(
                f"flashgen: kernel {spec.name} is not built for {spec.arch} (cache: "
                f"{paths.cache_dir()}) and FLASHGEN_JIT=0 forbids compiling it now; build it "
                f"with `{command}`")
        _log(f"flashgen: {spec.name} is configured but not built for {spec.arch}; compiling it "
             f"now (about half a minute; next time it loads from {paths.cache_dir()}). "
             f"`{command}` builds ahead of time.")
        (entry,) = _build().build([spec], log=_log)
    library = ctypes.CDLL(str(entry.lib))
    address = ctypes.cast(getattr(library, spec.name), ctypes.c_void_p).value
    error_string = ctypes.cast(library.flashgen_error_string, ctypes.c_void_p).value
    mask_ranges = 0
    if spec.computes_mask_ranges:
        mask_ranges = ctypes.cast(library.flashgen_mask_ranges, ctypes.c_void_p).value
    return Launcher(spec, address, error_string, library, mask_ranges)
