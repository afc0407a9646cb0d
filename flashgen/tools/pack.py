"""`flashgen pack`: built kernels as a wheel that `pip install` puts where the loader finds them
(flashgen/cache.py's kernel packages), so a machine without nvcc loads them without compiling.

The wheel holds one Python package, flashgen_kernels_<label>, whose folder has the cache's
layout (<arch>/<spec name>-<key>/kernel.so + meta.json) and which the "flashgen.kernels" entry
point names. The kernels are plain shared libraries that take flashgen's params: independent of
torch's ABI and of Python's version, so the wheel is tagged py3-none-<platform>.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sysconfig
import zipfile
from pathlib import Path

from flashgen import __version__, cache


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def write_wheel(entries, out: Path, label: str) -> Path:
    """A wheel of the cache entries (cache.Entry), distribution flashgen-kernels-<label>."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]*", label):
        raise ValueError(f"flashgen: a pack's name must be lowercase letters, digits and _, got "
                         f"{label!r}")
    if not entries:
        raise ValueError("flashgen: no kernel to pack")
    package = f"flashgen_kernels_{label}"
    dist = f"flashgen_kernels_{label}"
    info = f"{dist}-{__version__}.dist-info"
    files = {f"{package}/__init__.py": (f'"""Prebuilt flashgen kernels ({len(entries)}), found '
                                        f'through the flashgen.kernels entry point."""\n').encode()}
    for entry in sorted(entries, key=lambda e: e.path.name):
        folder = f"{package}/{entry.spec.arch}/{entry.path.name}"
        for name in (cache.LIB_NAME, cache.META_NAME):
            files[f"{folder}/{name}"] = (entry.path / name).read_bytes()
    archs = sorted({e.spec.arch for e in entries})
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: flashgen-kernels-{label.replace('_', '-')}\n"
        f"Version: {__version__}\nSummary: {len(entries)} prebuilt flashgen kernel(s) for "
        f"{', '.join(archs)}\nRequires-Dist: flashgen\n").encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: flashgen pack\n"
                              f"Root-Is-Purelib: false\nTag: py3-none-{platform_tag()}\n").encode()
    files[f"{info}/entry_points.txt"] = (f"[{cache.PACKAGE_ENTRY_POINTS}]\n{label} = "
                                         f"{package}\n").encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{__version__}-py3-none-{platform_tag()}.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    tmp.replace(wheel)  # a killed pack leaves no truncated wheel under the final name
    return wheel
