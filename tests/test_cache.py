"""The build cache under concurrency, kills, corruption and compiler errors. A fake nvcc stands in
for the real one, so these run in seconds on any machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from codegen import build, paths
from codegen.config import load_config
from codegen.spec import enumerate_specs
from flashgen import cache

FAKE_NVCC = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    if "--version" in args:
        print("Cuda compilation tools, release 0.0, fake nvcc for flashgen's tests")
        sys.exit(0)
    mode = os.environ.get("FAKE_NVCC_MODE", "ok")
    if mode == "fail":
        print("kernel.cu(42): error: planted template error", file=sys.stderr)
        sys.exit(1)
    if mode == "slow" and os.environ.get("FAKE_NVCC_SLOW_FOR", "") in " ".join(args):
        time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "2")))
    out = args[args.index("-o") + 1]
    if "-c" in args and os.environ.get("FAKE_NVCC_LOG"):
        with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
            log.write(out + "\\n")
    if "-c" in args or "-cubin" in args:  # what ptxas -v reports, as nvcc prints it
        print("ptxas info    : Used 77 registers, used 1 barriers", file=sys.stderr)
        print("    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads", file=sys.stderr)
    with open(out, "wb") as f:
        f.write(b"fake binary of " + args[-3].encode())
""")

SPECS = enumerate_specs(load_config(paths.DEFAULT_CONFIG), archs=["sm_90"], dtypes=["bf16"],
                        masks=["none"])


@pytest.fixture
def fake_toolchain(tmp_path, monkeypatch):
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(0o755)
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "FLASHGEN_CACHE_DIR": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cache.nvcc_version.cache_clear()
    yield dict(os.environ, **env)
    cache.nvcc_version.cache_clear()


def build_in_subprocess(env, spec_index: int, **extra_env) -> subprocess.Popen:
    code = (f"from tests.test_cache import SPECS; from codegen import build; "
            f"build.build([SPECS[{spec_index}]])")
    return subprocess.Popen([sys.executable, "-c", code], env=dict(env, **extra_env),
                            cwd=paths.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def entries(spec) -> list[Path]:
    return sorted(p for p in cache.arch_dir(spec.arch).glob(f"{spec.name}-*"))


def test_build_publishes_one_verified_entry_and_reuses_it(fake_toolchain):
    spec = SPECS[0]
    (entry,) = build.build([spec])
    assert entry.lib.is_file() and (entry.path / "meta.json").is_file()
    mtime = entry.lib.stat().st_mtime_ns
    (again,) = build.build([spec])  # cached: no compile
    assert again.path == entry.path and again.lib.stat().st_mtime_ns == mtime
    assert cache.find_entry(spec).path == entry.path
    assert entry.resources == {"registers": 77, "spill_bytes": 4, "stack_bytes": 8,
                               "wgmma_serialised": False}


def test_parse_ptxas_takes_the_worst_kernel():
    report = """ptxas info    : Compiling entry function 'a' for 'sm_90'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers
ptxas info    : Compiling entry function 'b' for 'sm_90'
    64 bytes stack frame, 72 bytes spill stores, 72 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 64 bytes cumulative stack size
"""
    assert build.parse_ptxas(report) == {"registers": 255, "spill_bytes": 72, "stack_bytes": 64,
                                         "wgmma_serialised": False}
    assert build.parse_ptxas("") == {"registers": 0, "spill_bytes": 0, "stack_bytes": 0,
                                     "wgmma_serialised": False}


def test_parse_ptxas_flags_wgmma_serialised_for_want_of_registers():
    """ptxas's C7512 is an info line, so a kernel built with it runs, but slowly."""
    report = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions "
              "are serialized due to insufficient register resources for the function 'k'\n"
              "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
              "ptxas info    : Used 168 registers, used 16 barriers\n")
    assert build.parse_ptxas(report)["wgmma_serialised"] is True


def test_two_processes_building_the_same_spec_both_succeed(fake_toolchain):
    spec = SPECS[0]
    procs = [build_in_subprocess(fake_toolchain, 0, FAKE_NVCC_MODE="slow") for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert len(entries(spec)) == 1 and cache.find_entry(spec) is not None
    assert sum("compiling 1 kernel" in out for out in outputs) == 1, outputs  # one compiled


def test_a_build_killed_half_way_leaves_nothing_that_loads(fake_toolchain):
    spec = SPECS[1]
    proc = build_in_subprocess(fake_toolchain, 1, FAKE_NVCC_MODE="slow", FAKE_NVCC_SLEEP="60")
    build_file = cache.arch_dir(spec.arch) / ".build" / "build.ninja"
    deadline = time.monotonic() + 60
    while not build_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert cache.find_entry(spec) is None and entries(spec) == []
    (entry,) = build.build([spec])  # the lock died with its holder; the next build works
    assert cache.find_entry(spec).path == entry.path


def test_a_killed_build_keeps_the_kernels_it_finished(fake_toolchain, tmp_path):
    """The next build compiles only what the killed one had not: sources it renders again are
    rewritten only where they changed, so ninja finds the finished objects up to date."""
    done, unfinished = SPECS[2], SPECS[3]
    compiled = tmp_path / "compiled.txt"
    code = ("from tests.test_cache import SPECS; from codegen import build; "
            "build.build([SPECS[2], SPECS[3]], jobs=2)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=paths.REPO_ROOT,
                            env=dict(fake_toolchain, FAKE_NVCC_MODE="slow",
                                     FAKE_NVCC_SLOW_FOR=unfinished.name, FAKE_NVCC_SLEEP="30",
                                     FAKE_NVCC_LOG=str(compiled)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    libs = cache.arch_dir(done.arch) / ".build" / "lib"
    deadline = time.monotonic() + 60
    while not any(libs.glob(f"{done.name}-*.so")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # ninja logs the finished link
    proc.kill()
    proc.wait()
    assert cache.find_entry(done) is None  # published only when a build ends
    compiled.write_text("")
    os.environ["FAKE_NVCC_LOG"] = str(compiled)
    try:
        build.build([done, unfinished])
    finally:
        del os.environ["FAKE_NVCC_LOG"]
    again = compiled.read_text()
    assert unfinished.name in again and done.name not in again
    assert cache.find_entry(done) is not None and cache.find_entry(unfinished) is not None


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_meta"])
def test_a_corrupted_entry_is_detected_and_rebuilt(fake_toolchain, damage):
    spec = SPECS[0]
    (entry,) = build.build([spec])
    if damage == "truncate":
        entry.lib.write_bytes(entry.lib.read_bytes()[:5])
    elif damage == "flip":
        data = bytearray(entry.lib.read_bytes())
        data[0] ^= 0xFF
        entry.lib.write_bytes(bytes(data))
    else:
        (entry.path / "meta.json").unlink()
    assert cache.find_entry(spec) is None
    assert not entry.path.exists()  # the bad entry is removed, never loaded
    (rebuilt,) = build.build([spec])
    assert cache.find_entry(spec).path == rebuilt.path


def test_a_compiler_error_is_reported_with_its_command_and_spares_the_cache(fake_toolchain,
                                                                            monkeypatch):
    good, bad = SPECS[0], SPECS[1]
    (good_entry,) = build.build([good])
    monkeypatch.setenv("FAKE_NVCC_MODE", "fail")
    with pytest.raises(build.BuildError) as info:
        build.build([bad])
    message = str(info.value)
    assert "planted template error" in message  # the compiler's own words
    assert "nvcc" in message and f"{bad.name}.cu" in message  # the command line
    assert bad.name in message.splitlines()[0]
    assert cache.find_entry(bad) is None
    assert cache.find_entry(good).path == good_entry.path


def test_without_nvcc_an_entry_built_from_the_same_sources_still_loads(fake_toolchain,
                                                                       monkeypatch, tmp_path):
    spec = SPECS[0]
    (entry,) = build.build([spec])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    cache.nvcc_version.cache_clear()
    assert cache.find_entry(spec).path == entry.path
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.build([SPECS[1]])


def test_lock_timeout_names_the_lock_and_its_holder(tmp_path):
    lock = tmp_path / ".lock"
    with build.cache_lock(lock):
        code = (f"from codegen import build; from pathlib import Path\n"
                f"with build.cache_lock(Path({str(lock)!r}), timeout=0.5): pass")
        result = subprocess.run([sys.executable, "-c", code], cwd=paths.REPO_ROOT,
                                capture_output=True, text=True)
    assert result.returncode != 0
    assert str(lock) in result.stderr and f"pid {os.getpid()}" in result.stderr


def test_key_covers_exactly_the_headers_a_kernel_includes(tmp_path, monkeypatch):
    """Editing a backward header rebuilds backward kernels only; a shared one rebuilds both."""
    import shutil

    include = tmp_path / "include"
    shutil.copytree(paths.INCLUDE_DIR, include)
    monkeypatch.setattr(paths, "INCLUDE_DIR", include)
    cache._header_closure.cache_clear()
    fwd = next(s for s in SPECS if s.kind == "fwd" and s.family == "mma")
    bwd = next(s for s in SPECS if s.kind == "bwd" and s.family == "mma")
    before = cache.input_key(fwd), cache.input_key(bwd)

    def touch(header: str) -> tuple[str, str]:
        path = include / "flashgen" / header
        path.write_text(path.read_text() + "\n// edited\n")
        return cache.input_key(fwd), cache.input_key(bwd)

    try:
        after_bwd_edit = touch("mma/bwd_kernel.cuh")
        assert after_bwd_edit[0] == before[0] and after_bwd_edit[1] != before[1]
        after_shared_edit = touch("common/mask.cuh")
        assert after_shared_edit[0] != before[0] and after_shared_edit[1] != after_bwd_edit[1]
    finally:
        cache._header_closure.cache_clear()


def test_the_key_covers_every_header_a_rendered_source_includes():
    """The key reads the templates' and a variant's includes without rendering: at least the
    headers that each template's rendered sources include, a variant's among them."""
    from codegen import render

    specs = enumerate_specs(load_config(paths.DEFAULT_CONFIG))
    variant_specs = {(s.family, s.kind, s.variant.name): s for s in specs if s.variant}
    for spec in [*render.samples(specs), *variant_specs.values()]:
        rendered = cache.included_headers(render.render_spec(spec))
        assert rendered and rendered <= cache.render_input_headers(spec), spec.name


def test_keys_differ_for_every_configured_spec():
    specs = enumerate_specs(load_config(paths.DEFAULT_CONFIG))
    assert len({cache.input_key(s) for s in specs}) == len(specs)


def test_key_covers_a_variants_snippet_and_the_flags(monkeypatch):
    import dataclasses

    config = load_config(paths.DEFAULT_CONFIG)
    spec = next(s for s in enumerate_specs(config) if s.variant and s.variant.mask_mod)
    edited = dataclasses.replace(spec, variant=dataclasses.replace(
        spec.variant, mask_mod=f"({spec.variant.mask_mod}) & (kv_idx >= 0)"))
    assert edited.name == spec.name and cache.input_key(edited) != cache.input_key(spec)
    before = cache.input_key(spec)
    monkeypatch.setattr(cache, "NVCC_FLAGS", [*cache.NVCC_FLAGS, "-DFLASHGEN_EDITED"])
    assert cache.input_key(spec) != before


@pytest.fixture
def copied_tree(tmp_path, monkeypatch):
    """The templates and headers copied into tmp_path, the families reading them from there."""
    import dataclasses
    import shutil

    from codegen import families

    templates = tmp_path / "templates"
    shutil.copytree(paths.TEMPLATES_DIR, templates)
    monkeypatch.setattr(paths, "INCLUDE_DIR", templates / "include")
    for name, family in families.FAMILIES.items():
        monkeypatch.setitem(families.FAMILIES, name, dataclasses.replace(
            family, template_dir=templates / family.template_dir.name))
    cache._header_closure.cache_clear()
    yield templates
    cache._header_closure.cache_clear()


@pytest.mark.parametrize("has_nvcc", [True, False])
def test_a_template_or_header_change_makes_the_lookup_miss(fake_toolchain, copied_tree,
                                                           monkeypatch, tmp_path, has_nvcc):
    """With nvcc the entry's folder name misses; without, no entry's meta matches."""
    fwd = next(s for s in SPECS if s.kind == "fwd" and s.family == "mma")
    bwd = next(s for s in SPECS if s.kind == "bwd" and s.family == "mma")
    build.build([fwd, bwd])
    if not has_nvcc:
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
        monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
        cache.nvcc_version.cache_clear()
    assert cache.find_entry(fwd) and cache.find_entry(bwd)
    template = copied_tree / "mma" / "fwd_kernel.cu.j2"
    template.write_text(template.read_text() + "// edited\n")
    assert cache.find_entry(fwd) is None and cache.find_entry(bwd) is not None
    header = copied_tree / "include" / "flashgen" / "mma" / "bwd_kernel.cuh"
    header.write_text(header.read_text() + "// edited\n")
    assert cache.find_entry(bwd) is None


def test_an_unchanged_tree_hits_without_rendering(fake_toolchain, monkeypatch):
    """A fresh process finds a built entry without importing the renderer or Jinja."""
    spec = SPECS[0]
    (entry,) = build.build([spec])
    code = (f"import sys\nfrom codegen import paths\nfrom codegen.config import load_config\n"
            f"from codegen.spec import enumerate_specs\nfrom flashgen import cache\n"
            f"spec = [s for s in enumerate_specs(load_config(paths.DEFAULT_CONFIG)) "
            f"if s.name == {spec.name!r}][0]\n"
            f"print(cache.find_entry(spec).path)\n"
            f"print(sorted(m for m in ('jinja2', 'codegen.render', 'codegen.build') "
            f"if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], env=fake_toolchain, cwd=paths.REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(entry.path), "[]"]


def test_a_build_counts_kernels_not_link_steps_and_estimates_the_rest(tmp_path, monkeypatch):
    """run_ninja's progress: a line per compiled kernel with the time left; links are silent."""
    fake = tmp_path / "ninja"
    fake.write_text("#!/bin/sh\nprintf '[1/4 0s] nvcc fwd_a\\n[2/4 0s] link fwd_a\\n"
                    "[3/4 1s] nvcc fwd_b\\n[4/4 1s] link fwd_b\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(build.shutil, "which", lambda name: str(fake))
    logged = []
    ok, _, _ = build.run_ninja(tmp_path, None, logged.append, kernels=2)
    assert ok and len(logged) == 2
    assert logged[0].startswith("[1/2 kernels, ") and logged[0].endswith("left] fwd_a")
    assert logged[1].startswith("[2/2 kernels, ") and "about 0s left" in logged[1]


def first_use_builds(monkeypatch, tmp_path) -> list:
    """loader._compile's builds (the specs of each), through a stand-in for codegen.build."""
    from flashgen import loader

    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASHGEN_JIT", "1")
    monkeypatch.setattr(loader, "_binding", None)  # a fresh install: no binding either
    builds = []

    class Build:
        @staticmethod
        def build(specs, log=print):
            builds.append(sorted(s.name for s in specs))
            return [cache.Entry(s, tmp_path / s.name) for s in specs]

        @staticmethod
        def build_binding(log=print):
            builds.append(["binding"])

    monkeypatch.setattr(loader, "_build", lambda: Build)
    return builds


def test_a_forward_first_used_by_a_call_that_wants_gradients_compiles_with_its_backward(
        monkeypatch, tmp_path):
    from flashgen import loader

    builds = first_use_builds(monkeypatch, tmp_path)
    (forward,) = (s for s in SPECS if s.name == "fwd_hopper_sm90_bf16_hd128_none_m128n128s2p1o1")
    assert loader._compile(forward).spec == forward
    with loader.gradients_wanted():
        assert loader._compile(forward).spec == forward
    backward = loader._backward_of(forward)
    assert backward.kind == "bwd" and backward.head_dim == 128 and backward.mask == "none"
    kernels = [b for b in builds if b != ["binding"]]
    assert kernels == [[forward.name], sorted([forward.name, backward.name])]
    assert ["binding"] in builds  # built beside the first kernel, not after it


def test_a_first_use_build_shows_only_a_wait_for_another_builder(capsys):
    from flashgen import loader

    loader._quiet("[1/2 kernels, 31s, about 31s left] fwd_hopper_sm90_bf16_hd96_window")
    loader._quiet("flashgen: waiting for another build (pid 7) holding /cache/sm_90/.lock")
    assert capsys.readouterr().err == ("flashgen: waiting for another build (pid 7) holding "
                                       "/cache/sm_90/.lock\n")
