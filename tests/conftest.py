import ctypes
import os
import shutil
import subprocess
import sys

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped on machines without one")
    config.addinivalue_line("markers", "nvcc: compiles CUDA with nvcc (slow on a CPU machine)")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _flashgen_own_contract(monkeypatch):
    """Each test runs under flashgen's own contract (the backward's split tail on), whatever an
    earlier flashgen.compat.install() in the session set; tests/fa2 asks for FA2's."""
    schedule = sys.modules.get("flashgen.schedule")
    if schedule is not None:
        monkeypatch.setattr(schedule, "_dkdv_reproducible", False)


@pytest.fixture(autouse=True)
def _fresh_decode_plans():
    """Each test plans its decode calls afresh: a plan holds the launchers a test may have
    patched in (decode.py's plans per shape signature), and checks them afresh (kvcache.py's
    recipes per signature)."""
    decode = sys.modules.get("flashgen.decode")
    if decode is not None:
        decode.clear_plans()
    kvcache = sys.modules.get("flashgen.kvcache")
    if kvcache is not None:
        kvcache.clear_recipes()


@pytest.fixture(scope="session")
def host_library(tmp_path_factory):
    """host_library(name, source): C++ source that includes flashgen headers, compiled for the
    host with the C++ compiler ($CXX; the CUDA qualifiers defined away) into a shared library and
    loaded through ctypes. Skips where there is no host compiler."""
    from codegen import paths

    def build(name: str, source: str) -> ctypes.CDLL:
        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None:
            pytest.skip("no host C++ compiler")
        folder = tmp_path_factory.mktemp(name)
        (folder / f"{name}.cpp").write_text(source)
        library = folder / f"{name}.so"
        subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-D__host__=", "-D__device__=",
                        "-D__forceinline__=inline", f"-I{paths.INCLUDE_DIR}",
                        str(folder / f"{name}.cpp"), "-o", str(library)], check=True)
        return ctypes.CDLL(str(library))

    return build
