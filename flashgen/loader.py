"""Build-or-load: turns a spec into a callable launcher address, compiling it on first use. A
kernel or binding found in the cache loads without the generator; only a miss imports it
(codegen/build.py: Jinja, ninja, nvcc)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
import time
from dataclasses import dataclass

from codegen import paths
from codegen.spec import KernelSpec
from flashgen import cache

_lock = threading.Lock()
_launchers: dict[KernelSpec, "Launcher"] = {}
_binding = None
_calls = threading.local()  # .gradients: this thread's forward call wants gradients


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


def _quiet(message: str) -> None:
    """A first-use build's own log: its per-kernel lines say nothing the two lines around it do
    not (errors still raise with the compiler's output); a wait for another process's build
    lock still shows."""
    if message.startswith("flashgen: waiting"):
        _log(message)


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


class _GradientsWanted:
    """Within it, a forward kernel compiled on first use compiles with its backward, in one
    parallel build: a training step's first call waits for the slower of the two, not their
    sum. The autograd path of the forward op enters it on every call, so it is a plain class
    (0.7 us a call, CPU) rather than a generator context manager (1.2 us)."""

    def __enter__(self):
        self.before = getattr(_calls, "gradients", False)
        _calls.gradients = True

    def __exit__(self, *exc):
        _calls.gradients = self.before


def gradients_wanted() -> _GradientsWanted:
    return _GradientsWanted()


def _backward_of(spec: KernelSpec) -> KernelSpec | None:
    """The backward kernel a dense call of forward kernel `spec` runs, where one is configured."""
    from flashgen import dispatch, registry

    try:
        choices = registry.candidates(spec.arch, "bwd", spec.dtype, spec.head_dim, spec.mask,
                                      spec.score_mod, dropout=spec.dropout)
    except dispatch.DispatchError:  # the backward's own call raises what to configure
        return None
    return choices[0].spec if choices else None


def _compile(spec: KernelSpec) -> cache.Entry:
    """Builds a kernel not in the cache at its first call (with its backward under
    gradients_wanted, and the binding beside it where that is not built either) and returns its
    entry; FLASHGEN_JIT=0 makes that an error."""
    command = (f"flashgen generate --arch {spec.arch} --head-dim {spec.head_dim} "
               f"--dtype {spec.dtype}")
    if not paths.jit_enabled():
        raise RuntimeError(
            f"flashgen: kernel {spec.name} is not built for {spec.arch} (cache: "
            f"{paths.cache_dir()}) and FLASHGEN_JIT=0 forbids compiling it now; build it "
            f"with `{command}`")
    specs = [spec]
    if spec.kind == "fwd" and getattr(_calls, "gradients", False):
        backward = _backward_of(spec)
        if backward is not None and cache.find_entry(backward) is None:
            specs.append(backward)
    names = " and ".join(s.name for s in specs)
    _log(f"flashgen: {names} {'is' if len(specs) == 1 else 'are'} configured but not built for "
         f"{spec.arch}; compiling now (next time it loads from {paths.cache_dir()}). "
         f"`{command}` builds ahead of time.")
    start = time.monotonic()
    binding_build = None
    if _binding is None and not cache.binding_path().is_file():  # a fresh install's first call
        binding_build = threading.Thread(target=_build_binding_quietly, daemon=True)
        binding_build.start()
    (entry,) = (e for e in _build().build(specs, log=_quiet) if e.spec == spec)
    if binding_build is not None:
        binding_build.join()
    _log(f"flashgen: compiled {names} in {time.monotonic() - start:.1f} s")
    return entry


def _build_binding_quietly() -> None:
    """The binding's build beside a kernel's (its own lock); a failure shows when binding() builds
    it again."""
    try:
        _build().build_binding(log=_quiet)
    except Exception:  # noqa: BLE001 - binding() raises it with the compiler's output
        pass


def launcher(spec: KernelSpec) -> Launcher:
    found = _launchers.get(spec)
    if found is not None:
        return found
    with _lock:
        if spec not in _launchers:
            _launchers[spec] = _load(spec)
    return _launchers[spec]


def _load(spec: KernelSpec) -> Launcher:
    entry = cache.find_entry(spec) or _compile(spec)
    library = ctypes.CDLL(str(entry.lib))
    address = ctypes.cast(getattr(library, spec.name), ctypes.c_void_p).value
    error_string = ctypes.cast(library.flashgen_error_string, ctypes.c_void_p).value
    mask_ranges = 0
    if spec.computes_mask_ranges:
        mask_ranges = ctypes.cast(library.flashgen_mask_ranges, ctypes.c_void_p).value
    return Launcher(spec, address, error_string, library, mask_ranges)
