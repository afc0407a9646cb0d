"""The wheel is self-contained: built from the checkout, installed into a fresh venv and run from
outside the source tree, flashgen finds its templates, headers and config inside the installed
package, renders into the cache rather than site-packages, and compiles a kernel. About 75 s
on two cores, most of it one nvcc compile; deselect with -m "not slow"."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from codegen import paths
from codegen.config import load_config
from codegen.spec import enumerate_specs

pytestmark = pytest.mark.slow

# What the build reads. The wheel is built from a copy of these: an in-tree build would leave
# build/ and flashgen.egg-info/ in the checkout, and setuptools reuses build/lib, which can carry
# files deleted from the checkout into a wheel.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "codegen", "flashgen", "templates")


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
                                    f"{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, its site-packages, environment, working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    src.mkdir()
    for name in BUILD_INPUTS:
        source = paths.REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", dist, src])
    wheel, = dist.glob("flashgen-*.whl")

    # --system-site-packages shows torch and the other dependencies already installed, and pip;
    # the .pth adds the running environment's, for a pytest that itself runs in a venv.
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                   .stdout.strip())
    (purelib / "running_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --force-reinstall: the same version is installed already (editable, from the checkout).
    _run([python, "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q", wheel])

    work = tmp / "work"  # the working folder: not the checkout, so it cannot shadow the install
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLASHGEN_CONFIG")}
    env["FLASHGEN_CACHE_DIR"] = str(tmp / "cache")
    return python, purelib.resolve(), env, work


def _installed_files(purelib: Path) -> set[Path]:
    return {p for p in purelib.rglob("*") if "__pycache__" not in p.parts}


def test_installed_package_runs_outside_the_checkout(installed):
    python, purelib, env, work = installed
    located = _run([python, "-c", "import codegen, flashgen\nfrom codegen import paths\n"
                    "print(codegen.__file__, flashgen.__file__, paths.TEMPLATES_DIR, "
                    "paths.DEFAULT_CONFIG, sep='\\n')"], cwd=work, env=env).stdout.split()
    for path in map(Path, located):
        assert path.resolve().is_relative_to(purelib), (path, purelib)
        assert not path.resolve().is_relative_to(paths.REPO_ROOT), path
    include = purelib / "codegen" / "templates" / "include" / "flashgen"
    assert (include / "common" / "params.h").is_file()
    assert (include / "hopper" / "fwd_kernel.cuh").is_file()

    flashgen = python.parent / "flashgen"
    listed = _run([flashgen, "list"], cwd=work, env=env).stdout
    assert "fwd_mma_sm90_bf16_hd128_causal_" in listed and "bwd_mma_sm80_fp16_hd64_none_" in listed
    assert "fwd_hopper_sm90_bf16_hd128_causal_" in listed
    kernels = len(enumerate_specs(load_config(paths.DEFAULT_CONFIG)))  # test_spec_render.py counts
    assert listed.rstrip().endswith(f"{kernels} kernel(s)")

    before = _installed_files(purelib)
    generated = Path(env["FLASHGEN_CACHE_DIR"]) / "generated"
    out = _run([flashgen, "generate", "--dry-run"], cwd=work, env=env).stdout
    assert f"into {generated} " in out
    assert (generated / "manifest.json").is_file()
    assert sorted(p.relative_to(generated).as_posix() for p in generated.glob("*/*.cu")) == [
        "hopper/bwd_sample.cu", "hopper/fwd_fp8_sample.cu", "hopper/fwd_sample.cu",
        "mma/bwd_sample.cu", "mma/fwd_sample.cu", "mma/kvcache_sample.cu"]
    assert (generated / "manifest.json").read_text().count('"name": ') == kernels
    assert _installed_files(purelib) == before  # nothing rendered into site-packages
    assert not any(work.iterdir())


@pytest.mark.nvcc
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed: the installed "
                    "package's compile check needs it")
def test_installed_package_compiles_a_kernel(installed):
    """One small forward spec to an object file, with the installed package's headers."""
    python, purelib, env, work = installed
    script = """
from codegen import build, paths
from codegen.config import load_config
from codegen.spec import enumerate_specs

specs = enumerate_specs(load_config(paths.DEFAULT_CONFIG), archs=["sm_80"], head_dims=[32],
                        dtypes=["fp16"], masks=["none"], kinds=["fwd"], alt_tiles=False,
                        score_mods=["none"], dropout=False)
assert len(specs) == 1, specs
build.build(specs, objects_only=True, log=lambda line: None)
print(specs[0].name)
"""
    name = _run([python, "-c", script], cwd=work, env=env).stdout.split()[-1]
    build_dir = Path(env["FLASHGEN_CACHE_DIR"]) / "sm_80" / ".build"
    objects = list((build_dir / "obj").glob(f"{name}-*.o"))
    assert len(objects) == 1 and objects[0].stat().st_size > 10_000
    assert f"-I{purelib / 'codegen' / 'templates' / 'include'}" in (
        build_dir / "build.ninja").read_text()
