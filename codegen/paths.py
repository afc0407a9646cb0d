"""Every path and environment variable flashgen reads, in one place."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# An installed wheel carries the top-level templates/ folder inside the package (setup.py maps it
# to codegen/templates); a checkout or an editable install reads the checkout's templates/. The
# packaged copy wins, so an installed flashgen never reads whatever sits beside site-packages.
_PACKAGED_TEMPLATES = PACKAGE_DIR / "templates"
FROM_CHECKOUT = not _PACKAGED_TEMPLATES.is_dir()
REPO_ROOT = PACKAGE_DIR.parent  # the checkout's root when FROM_CHECKOUT
TEMPLATES_DIR = REPO_ROOT / "templates" if FROM_CHECKOUT else _PACKAGED_TEMPLATES
INCLUDE_DIR = TEMPLATES_DIR / "include"
GENERATED_DIR = REPO_ROOT / "generated"  # the checkout's rendered sources, kept for review
DEFAULT_CONFIG = PACKAGE_DIR / "configs" / "default.toml"


def config_path() -> Path:
    """The config the runtime and the CLI use unless told otherwise ($FLASHGEN_CONFIG)."""
    return Path(os.environ.get("FLASHGEN_CONFIG") or DEFAULT_CONFIG)


def forced_family() -> str | None:
    """$FLASHGEN_FAMILY: run that kernel family's kernels wherever it has the kind (unset: the best
    configured)."""
    return os.environ.get("FLASHGEN_FAMILY") or None


def cache_dir() -> Path:
    """Root of the build cache ($FLASHGEN_CACHE_DIR, else ~/.cache/flashgen)."""
    env = os.environ.get("FLASHGEN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flashgen"


def jit_enabled() -> bool:
    """$FLASHGEN_JIT=0 turns off compiling missing kernels at call time."""
    return os.environ.get("FLASHGEN_JIT", "1") != "0"


def cutlass_include_dir() -> Path:
    """CUTLASS/CuTe headers from the nvidia-cutlass package, found without importing it."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "CUTLASS headers not found: install them with `pip install nvidia-cutlass`")
    include = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    if not (include / "cute" / "tensor.hpp").is_file():
        raise FileNotFoundError(f"nvidia-cutlass is installed but {include} has no CuTe headers")
    return include


def nvcc_path() -> str | None:
    """nvcc from $CUDA_HOME, else from PATH."""
    import shutil

    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").is_file():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc")
