"""nvcc compiles one spec of each family, kind and arch target to object files (the hopper kernels
for sm_90a, with ptxas warnings as errors), half of them with the softcap score modifier, plus one
with ALiBi and two of config-defined variants (the default config's document mask forward, and
block_sparse's backward, which walks by its bitmaps) and the e4m3 forward: catches template errors
on machines without a GPU. The slowest CPU test (about a minute per kernel per core, eleven
kernels). A variant's snippets compile alone first, and a broken one names its table. One decode
spec builds split (device code and launch code apart) and links."""

from __future__ import annotations

import dataclasses
import re

import pytest

from codegen import build, paths
from codegen.config import load_config
from codegen.spec import enumerate_specs

pytestmark = pytest.mark.nvcc


@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed")
def test_one_spec_per_kind_and_arch_compiles_to_an_object(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    config = load_config(paths.DEFAULT_CONFIG)
    # Causal (the masking path) at head dim 96, which pads its shared-memory rows: the most
    # template code per kernel (the hopper backward's two dQ shapes, 64 and 32 columns, there);
    # the hopper backward's dQ split by rows at head dim 64. The softcap score modifier where a
    # template compiles once, and on one arch of the others.
    plain = {("mma", "fwd", "sm_90"), ("mma", "bwd", "sm_80")}
    specs = [s for s in enumerate_specs(config, head_dims=[96], dtypes=["bf16"],
                                        masks=["causal"], dropout=False)
             if s.score_mod in ("none", "softcap")
             and (s.score_mod == "none") == ((s.family, s.kind, s.arch) in plain)]
    specs += enumerate_specs(config, head_dims=[64], dtypes=["bf16"], masks=["causal"],
                             kinds=["bwd"], family_names=["hopper"], score_mods=["none"],
                             dropout=False)
    specs += enumerate_specs(config, head_dims=[96], dtypes=["bf16"], masks=["causal"],
                             kinds=["bwd"], archs=["sm_80"], score_mods=["alibi"], dropout=False)
    # A config-defined variant, with dropout (its table opts in): the variant mask's code and
    # dropout's in one hopper forward.
    specs += enumerate_specs(config, head_dims=[64], dtypes=["bf16"], masks=["document"],
                             kinds=["fwd"], family_names=["hopper"], dropout=True)
    specs += enumerate_specs(config, head_dims=[64], dtypes=["bf16"], masks=["block_sparse"],
                             kinds=["bwd"], family_names=["hopper"])
    # The e4m3 forward, whose traits check P's register layout against CuTe's (fragments.cuh).
    specs += enumerate_specs(config, head_dims=[128], dtypes=["bf16"], masks=["causal"],
                             kinds=["fwd_fp8"])
    # Dropout where its code differs most: the mma backward's column-paired tiles and the hopper
    # backward's lane swap.
    specs = [dataclasses.replace(s, dropout=True) if s.kind == "bwd" and s.arch == "sm_90"
             and s.score_mod == "softcap" else s for s in specs]
    assert sorted((s.family, s.kind, s.arch, s.mask, s.score_mod, s.dropout) for s in specs) == [
        ("hopper", "bwd", "sm_90", "block_sparse", "none", False),
        ("hopper", "bwd", "sm_90", "causal", "none", False),
        ("hopper", "bwd", "sm_90", "causal", "softcap", True),
        ("hopper", "fwd", "sm_90", "causal", "softcap", False),
        ("hopper", "fwd", "sm_90", "document", "none", True),
        ("hopper", "fwd_fp8", "sm_90", "causal", "none", False),
        ("mma", "bwd", "sm_80", "causal", "alibi", False),
        ("mma", "bwd", "sm_80", "causal", "none", False),
        ("mma", "bwd", "sm_90", "causal", "softcap", True),
        ("mma", "fwd", "sm_80", "causal", "softcap", False),
        ("mma", "fwd", "sm_90", "causal", "none", False)]
    build.build(specs, objects_only=True)
    for spec in specs:
        objects = list((tmp_path / spec.arch / ".build" / "obj").glob(f"{spec.name}-*.o"))
        assert len(objects) == 1 and objects[0].stat().st_size > 10_000


@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed")
def test_a_broken_variant_snippet_fails_with_its_table_and_the_compiler_message():
    config = load_config(paths.DEFAULT_CONFIG)
    spec = enumerate_specs(config, masks=["document"])[0]
    broken = dataclasses.replace(spec.variant, mask_mod="doc_ids(b, q_idx) == undefined_name")
    with pytest.raises(build.BuildError, match=r"(?s)\[variants\.document\] does not compile.*"
                                               r"identifier \"undefined_name\" is undefined"):
        build.build([dataclasses.replace(spec, variant=broken)], objects_only=True)


@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed")
def test_a_split_build_links_the_device_code_its_launcher_names(tmp_path, monkeypatch):
    """A split build (common/launch.cuh) compiles the device code to a cubin and the launch code
    apart; the library holds the whole cubin, and the launch code registers each of its kernels
    by the name the launch looks up in it. The hd64 decode spec launches three kernels (append,
    and attention whose last split combines, its warps across the rows or, over a paged cache,
    across the keys)."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASHGEN_SPLIT_BUILD", "1")
    config = load_config(paths.DEFAULT_CONFIG)
    spec = enumerate_specs(config, archs=["sm_90"], kinds=["kvcache"], head_dims=[64],
                           dtypes=["bf16"], masks=["none"], score_mods=["none"])[0]
    (entry,) = build.build([spec])
    objects = tmp_path / spec.arch / ".build" / "obj"
    (cubin,) = [p.read_bytes() for p in objects.glob(f"{spec.name}-*.cubin")]
    (launch_code,) = [p.read_bytes() for p in objects.glob(f"{spec.name}-*.o")
                      if not p.name.endswith("-device.o")]
    assert cubin.startswith(b"\x7fELF") and cubin in entry.lib.read_bytes()
    symbols = re.findall(rb"_ZN8flashgen\d+[a-z_]+_kernelI\w+", cubin)
    kernels = {re.sub(rb"_param_\d+$", b"", symbol) for symbol in symbols}
    assert len(kernels) == 3
    assert all(name in launch_code for name in kernels)
