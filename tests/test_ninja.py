"""build.ninja for whole and split kernel builds (codegen/ninja.py), and when a build splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen import build, ninja


def target(split: bool, folder: Path = Path("/cache/.build")) -> ninja.KernelTarget:
    return ninja.KernelTarget(name="fwd_x", source=folder / "src" / "fwd_x.cu",
                              obj=folder / "obj" / "fwd_x-k.o", lib=folder / "lib" / "fwd_x-k.so",
                              gencode="-gencode=arch=compute_90a,code=sm_90a", split=split)


def edges(text: str) -> list[tuple[str, str]]:
    """(rule, output) of each build line."""
    return [(line.split(": ", 1)[1].split()[0], line.split(": ", 1)[0].split()[1])
            for line in text.splitlines() if line.startswith("build ")]


def test_a_whole_kernel_compiles_one_object_and_links_it():
    text = ninja.kernel_ninja([target(False)], "nvcc", ["-O3"], [Path("/inc")])
    assert edges(text) == [("compile", "/cache/.build/obj/fwd_x-k.o"),
                           ("link", "/cache/.build/lib/fwd_x-k.so")]


def test_a_split_kernel_compiles_device_and_launch_code_apart_and_links_both():
    text = ninja.kernel_ninja([target(True)], "nvcc", ["-O3"], [Path("/inc")])
    assert edges(text) == [("device", "/cache/.build/obj/fwd_x-k.cubin"),
                           ("launcher", "/cache/.build/obj/fwd_x-k.o"),
                           ("embed", "/cache/.build/obj/fwd_x-k-device.o"),
                           ("link", "/cache/.build/lib/fwd_x-k.so")]
    assert "-cubin $in" in text and "-DFLASHGEN_LAUNCH_ONLY -c $in" in text
    link = next(line for line in text.splitlines() if line.startswith("build /cache/.build/lib"))
    assert link.endswith("fwd_x-k.o /cache/.build/obj/fwd_x-k-device.o")
    # The embedded object is rebuilt when the cubin changes.
    assert "fwd_x-k-device.cpp | /cache/.build/obj/fwd_x-k.cubin" in text


def test_the_embedded_device_code_names_its_cubin_with_quotes_escaped():
    source = ninja.embed_source(Path('/odd "dir"/k.cubin'))
    assert '".incbin \\"/odd \\\\\\"dir\\\\\\"/k.cubin\\"\\n"' in source
    assert '".hidden flashgen_device_code\\n"' in source


@pytest.mark.parametrize("kernels, cores, split", [(1, 2, True), (2, 2, False), (2, 16, True),
                                                   (8, 16, True), (9, 16, False)])
def test_a_build_splits_where_its_compiles_leave_cores_idle(kernels, cores, split, monkeypatch):
    monkeypatch.delenv("FLASHGEN_SPLIT_BUILD", raising=False)
    assert build.split_build(kernels, cores) is split


@pytest.mark.parametrize("forced", ["0", "1"])
def test_flashgen_split_build_decides_for_every_build(forced, monkeypatch):
    monkeypatch.setenv("FLASHGEN_SPLIT_BUILD", forced)
    assert build.split_build(1, 64) is (forced == "1") and build.split_build(100, 2) is (
        forced == "1")
