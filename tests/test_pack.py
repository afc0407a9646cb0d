"""`flashgen pack`: built kernels as a wheel, installed into a fresh virtual environment and
loaded there from the package, with nothing in that environment's cache. The kernels here are
stand-ins compiled by the host compiler (they export what a kernel exports), so no nvcc runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("torch")

from codegen.config import load_config  # noqa: E402
from codegen.spec import enumerate_specs  # noqa: E402
from flashgen import cache, cli  # noqa: E402
from flashgen.tools import pack  # noqa: E402

FILTERS = ["--arch", "sm_80", "--family", "mma", "--kind", "fwd", "--head-dim", "64", "--dtype",
           "bf16", "--mask", "none", "--score-mod", "none", "--dropout", "without"]


def selected_specs():
    config = load_config(cache.paths.config_path())
    return enumerate_specs(config, archs=["sm_80"], head_dims=[64], dtypes=["bf16"],
                           masks=["none"], kinds=["fwd"], family_names=["mma"],
                           score_mods=["none"], dropout=False)


@pytest.fixture
def built_stand_ins(tmp_path, monkeypatch):
    """The selected specs published in a fresh cache as host-compiled libraries that export
    their entry points."""
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler")
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "nvcc_version", lambda: "stand-in nvcc")
    specs = selected_specs()
    source = tmp_path / "kernels.c"
    source.write_text("".join(f"int {s.name}(const void* p, void* s) {{ return 0; }}\n"
                              for s in specs)
                      + 'const char* flashgen_error_string(int c) { return "stand-in"; }\n')
    lib = tmp_path / "kernels.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return [cache.publish(spec, lib, "stand-in nvcc", {}) for spec in specs]


def test_pack_writes_a_wheel_of_the_selected_entries(built_stand_ins, tmp_path, capsys):
    assert cli.main(["pack", *FILTERS, "--out", str(tmp_path / "dist"), "--name", "test"]) == 0
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"flashgen_kernels_test-{pack.__version__}-py3-none-" \
                         f"{pack.platform_tag()}.whl"
    names = zipfile.ZipFile(wheel).namelist()
    for entry in built_stand_ins:
        folder = f"flashgen_kernels_test/sm_80/{entry.path.name}"
        assert f"{folder}/kernel.so" in names and f"{folder}/meta.json" in names
    info = f"flashgen_kernels_test-{pack.__version__}.dist-info"
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert entry_points == "[flashgen.kernels]\ntest = flashgen_kernels_test\n"
    assert "pip install" in capsys.readouterr().out


def test_an_installed_pack_loads_in_a_fresh_environment(built_stand_ins, tmp_path):
    wheel = pack.write_wheel(built_stand_ins, tmp_path / "dist", "test")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    str(wheel)], check=True)
    script = (
        "from flashgen import cache, loader\n"
        "from tests.test_pack import selected_specs\n"
        "for spec in selected_specs():\n"
        "    launcher = loader.launcher(spec)\n"
        "    print(spec.name, launcher.address != 0, cache.package_of(cache.find_entry(spec)))\n")
    env = {**os.environ, "FLASHGEN_CACHE_DIR": str(tmp_path / "empty"), "FLASHGEN_JIT": "0"}
    out = subprocess.run([str(python), "-c", script], check=True, capture_output=True, text=True,
                         env=env, cwd=cache.paths.REPO_ROOT).stdout.split("\n")
    assert sorted(line for line in out if line) == sorted(
        f"{e.spec.name} True flashgen-kernels-test" for e in built_stand_ins)


def test_a_packaged_entry_whose_library_changed_is_not_loaded(built_stand_ins, tmp_path,
                                                              monkeypatch):
    root = tmp_path / "installed" / "flashgen_kernels_test"
    entry = built_stand_ins[0]
    shutil.copytree(entry.path, root / "sm_80" / entry.path.name)
    (root / "sm_80" / entry.path.name / "kernel.so").write_bytes(b"truncated")
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(cache, "package_roots", lambda: {"flashgen-kernels-test": root})
    assert cache.find_entry(entry.spec) is None
    assert (root / "sm_80" / entry.path.name / "kernel.so").exists()  # never discarded
