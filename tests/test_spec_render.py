"""Specs, names and rendering: deterministic, and the committed generated/ matches the config."""

from __future__ import annotations

import pytest

from codegen import params, paths, render
from codegen.arch import ARCHS
from codegen.config import load_config
from codegen.families import mma
from codegen.families.mma import resources
from codegen.families.hopper import resources as hopper_resources
from codegen.spec import enumerate_specs


@pytest.fixture(scope="module")
def specs():
    return enumerate_specs(load_config(paths.DEFAULT_CONFIG))


def test_spec_count_is_the_product_of_the_axes(specs):
    # Forward and backward kernels x 3 masks x 5 score modifiers (none, softcap, alibi,
    # softcap_alibi, bias): mma (2 kinds x 2 archs x 6 head dims + sm_80's 2 forward alt tiles;
    # sm_90 has none: the hopper family runs its short sequences) x 2 dtypes, hopper (5 forward head
    # dims + 5 backward ones) x 2 dtypes and 2 causal alt tiles x 2 dtypes on sm_90; then the mma
    # decode kernels, which take softcap and ALiBi (and both) of them: (2 archs x 3 head dims
    # + 2 sm_90 alt tiles) x 2 dtypes x 3 masks x 4. The config's dropout doubles the mma family's
    # forward and backward kernels and the hopper family's.
    built_in = (((2 * 2 * 6 + 2) * 2 * 3 * 2 + (5 * 3 + 2) * 2 * 2 + 5 * 3 * 2 * 2) * 5
                + (2 * 3 + 2) * 2 * 3 * 4)
    # The config's variants at head dims 64 and 128, forward and backward, each of their masks
    # (block_sparse, document, head_window, prefix_lm; relative_bias under none, causal and window)
    # 2 dtypes x mma ((sm_80's 2 forward tiles + 1 backward, sm_90's 1 + 1) x 2 head dims) and
    # hopper (2 kinds x 2 head dims), and the
    # hopper causal alt tile of head dim 64 x 2 dtypes for relative_bias. Document's table sets
    # dropout = true: its kernels again with dropout.
    variants = (4 + 3) * 2 * ((3 + 2) * 2 + 2 * 2) + 2
    document = 2 * ((3 + 2) * 2 + 2 * 2)
    # document's, head_window's and relative_bias's tables set kvcache = true: the KV-cache tiles
    # (sm_80 1, sm_90 2 per head dim) x 2 head dims x 2 dtypes, for 2 + 3 masks
    decode = (1 + 2) * 2 * 2 * 5
    # The hopper family's e4m3 forwards: head dims 64, 128 and 256 x 3 masks x 2 output dtypes,
    # no score modifier, variant or dropout.
    fp8 = 3 * 3 * 2
    assert len(specs) == built_in + variants + document + decode + fp8
    assert len({s.name for s in specs}) == len(specs)
    sm_90_variants = (4 + 3) * 2 * (2 * 2 + 2 * 2) + 2 + 2 * (2 * 2 + 2 * 2) + 2 * 2 * 2 * 5
    assert len([s for s in specs if s.arch == "sm_90"]) == (
        (2 * 6 * 2 * 3 * 2 + (34 + 30) * 2) * 5 + 30 * 4 + sm_90_variants + fp8)
    assert {(s.score_mod, s.variant, s.dropout) for s in specs if s.kind == "fwd_fp8"} == {
        ("none", None, False)}
    assert {(s.family, s.kind) for s in specs if s.dropout} == {("mma", "fwd"), ("mma", "bwd"),
                                                                 ("hopper", "fwd"),
                                                                 ("hopper", "bwd")}
    assert {s.variant.name for s in specs if s.dropout and s.variant} == {"document"}
    assert {s.score_mod for s in specs if s.kind == "kvcache"} == {"none", "softcap", "alibi",
                                                                  "softcap_alibi",
                                                                  "relative_bias"}
    assert {s.variant.name for s in specs if s.variant} == {"block_sparse", "document",
                                                            "head_window", "prefix_lm",
                                                            "relative_bias"}


def test_name_encodes_every_compile_time_parameter(specs):
    chosen = [s for s in specs if s.arch == "sm_90" and s.dtype == "bf16" and s.head_dim == 128
              and s.mask == "causal" and s.score_mod == "none" and not s.dropout]
    assert sorted(s.name for s in chosen) == ["bwd_hopper_sm90_bf16_hd128_causal_m64n128s3d1",
                                              "bwd_mma_sm90_bf16_hd128_causal_m64n128w8s2",
                                              # e4m3 inputs, bf16 output
                                              "fwd_fp8_hopper_sm90_bf16_hd128_causal_m128n128s2p1o1",
                                              "fwd_hopper_sm90_bf16_hd128_causal_m128n128s2p1o1",
                                              "fwd_mma_sm90_bf16_hd128_causal_m128n32w4s3",
                                              "kvcache_mma_sm90_bf16_hd128_causal_m128n32w4s3",
                                              "kvcache_mma_sm90_bf16_hd128_causal_m64n64w4s3"]
    # a score modifier follows the mask, then dropout
    names = {s.name for s in specs}
    assert "fwd_hopper_sm90_bf16_hd128_causal_softcap_m128n128s2p1o1" in names
    assert "bwd_mma_sm90_bf16_hd128_causal_softcap_dropout_m64n128w8s2" in names


def test_filters():
    config = load_config(paths.DEFAULT_CONFIG)
    chosen = enumerate_specs(config, archs=["sm_80"], head_dims=[64], dtypes=["fp16"],
                             masks=["none"], kinds=["fwd"], family_names=["mma"],
                             score_mods=["none"], dropout=False)
    assert sorted(s.name for s in chosen) == ["fwd_mma_sm80_fp16_hd64_none_m128n64w4s3",
                                              "fwd_mma_sm80_fp16_hd64_none_m64n64w4s2"]
    chosen = enumerate_specs(config, archs=["sm_90"], head_dims=[64], dtypes=["fp16"],
                             masks=["none"], kinds=["bwd"], score_mods=["none"], dropout=True)
    assert [s.name for s in chosen] == ["bwd_hopper_sm90_fp16_hd64_none_dropout_m128n128s2d1",
                                        "bwd_mma_sm90_fp16_hd64_none_dropout_m128n128w8s2"]


def test_without_alt_tiles_one_spec_per_kind_and_call_properties():
    specs = enumerate_specs(load_config(paths.DEFAULT_CONFIG), alt_tiles=False)
    # as above; variants: 7 masks x 2 dtypes x (mma 2 archs x 2 kinds + hopper 2 kinds) x 2
    # head dims, document's twice (with dropout), and the decode kernels of document,
    # head_window and relative_bias (5 masks x 2 dtypes x 2 archs x 2 head dims); the e4m3
    # forwards (3 head dims x 3 masks x 2 output dtypes)
    assert len(specs) == ((2 * 2 * 6 * 5 * 2 + 2 * 3 * 4) * 2 * 3 + (5 + 5) * 2 * 2 * 3 * 5
                          + 8 * 2 * (2 * 2 + 2) * 2 + 5 * 2 * 2 * 2 + 3 * 3 * 2)
    assert len({(s.family, s.kind, s.arch, s.dtype, s.head_dim, s.mask, s.score_mod, s.dropout)
                for s in specs}) == len(specs)
    assert "fwd_mma_sm90_bf16_hd128_causal_m128n32w4s3" in {s.name for s in specs}


@pytest.mark.parametrize("kind, traits", [("fwd", "FwdTraits"), ("bwd", "BwdTraits"),
                                          ("kvcache", "FwdTraits")])
def test_render_is_deterministic_and_instantiates_the_spec(specs, kind, traits):
    spec = next(s for s in specs if s.kind == kind and s.family == "mma"
                and s.score_mod == "none" and s.variant is None and not s.dropout)
    text = render.render_spec(spec)
    assert text == render.render_spec(spec)
    assert f'extern "C" int {spec.name}(' in text
    values = ", ".join(str(getattr(spec.tile, key)) for key in spec.tile.keys())
    assert f"flashgen::{traits}<{spec.head_dim}, {values}, " in text
    # the first spec without a score modifier, variant or dropout is causal
    policies = "flashgen::CausalMask, flashgen::IdentityScore"
    if kind == "kvcache":
        assert f"launch_decode<Traits, {policies}>" in text
    else:
        assert f"launch_{kind}<Traits, {policies}, flashgen::NoDropout>" in text
        twin = next(s for s in specs if s.dropout and s.kind == kind and s.arch == spec.arch
                    and s.head_dim == spec.head_dim and s.mask == "causal"
                    and s.score_mod == "none")
        assert f"launch_{kind}<Traits, {policies}, flashgen::Dropout>" in render.render_spec(twin)


def test_render_tree_writes_a_sample_per_template_the_manifest_and_its_summary(tmp_path, specs):
    changed = render.render_tree(specs, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in changed) == [
        "hopper/bwd_sample.cu", "hopper/fwd_fp8_sample.cu", "hopper/fwd_sample.cu",
        "manifest.json", "mma/bwd_sample.cu",
        "mma/fwd_sample.cu", "mma/kvcache_sample.cu", "summary.md"]
    assert render.render_tree(specs, tmp_path) == []
    stale = tmp_path / "sm_90" / "fwd_sm90_removed.cu"
    stale.parent.mkdir()
    stale.write_text("// old")
    assert render.render_tree(specs, tmp_path) == [stale] and not stale.exists()


def test_concurrent_renders_into_one_directory_do_not_collide(tmp_path):
    """Two `flashgen generate` runs sharing a cache render into one directory at once: each write
    goes through a temporary file of its own, so none fails and the file ends whole."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "hopper" / "bwd_sample.cu"
    texts = [f"// writer {i}\n" * 2000 for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(20):
            list(pool.map(lambda text: render.write_if_changed(path, text), texts))
    assert path.read_text() in texts
    assert [p.name for p in path.parent.iterdir()] == ["bwd_sample.cu"]  # no temporary left


def test_the_manifest_lists_every_spec(tmp_path, specs):
    import json

    render.render_tree(specs, tmp_path)
    entries = json.loads((tmp_path / "manifest.json").read_text())["kernels"]
    assert [e["name"] for e in entries] == [s.name for s in sorted(specs)]
    # the hopper backward's, hd64
    assert entries[0]["tile"] == {"block_m": 128, "block_n": 128, "q_stages": 2,
                                  "dq_before_dk": True}


def test_the_summary_counts_every_spec_once(specs):
    summary = render.summary_text(specs)
    assert summary.startswith(f"# {len(specs)} kernels\n")
    counts = [row.split(" | ") for row in summary.splitlines()
              if row.startswith("| ") and row.count(" | ") == 6 and row[2:].split()[0] != "family"]
    assert sum(int(row[4]) for row in counts) == len(specs)
    assert sum(int(row[5]) for row in counts) == sum(s.dropout for s in specs)
    assert "| hopper | bwd | sm_90 | 128 | m64n128s2d1 m64n128s3d1 m80n128s2d1 |" in summary


def test_committed_generated_tree_matches_a_fresh_render(tmp_path, specs):
    """The drift check on the samples and the summary (the manifest is not tracked): rerun
    `flashgen generate --dry-run` and commit generated/ if this fails."""
    render.render_tree(specs, tmp_path)
    fresh = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*")
             if p.is_file() and p.name != render.MANIFEST}
    committed = {p.relative_to(paths.GENERATED_DIR): p.read_text()
                 for p in paths.GENERATED_DIR.rglob("*")
                 if p.is_file() and p.name != render.MANIFEST}
    assert sorted(committed) == sorted(fresh), "generated/ lists other files than the config"
    drifted = [str(p) for p in fresh if fresh[p] != committed[p]]
    assert not drifted, f"generated/ is stale: {drifted}"


def test_committed_params_header_matches_the_table():
    """params.h is rendered from codegen/params.py: run `python -m codegen.params` if this fails."""
    assert (paths.INCLUDE_DIR / params.HEADER).read_text() == params.header_text()


def test_the_backward_stages_dq_for_bulk_adds_where_the_arch_has_them_and_it_pays():
    config = load_config(paths.DEFAULT_CONFIG)
    specs = enumerate_specs(config, kinds=["bwd"], dtypes=["bf16"], masks=["causal"],
                            family_names=["mma"])
    backward = {(s.arch, s.head_dim): s for s in specs}
    staged = {key for key, spec in backward.items()
              if mma.template_context(spec)["dq_bulk_reduce"]}
    # rows of 256 bytes and more, on the arch with bulk adds
    assert staged == {("sm_90", 64), ("sm_90", 96), ("sm_90", 128), ("sm_90", 192), ("sm_90", 256)}
    hopper = ARCHS["sm_90"]
    # hd256 fits its staging beside one Q/dO buffer, not beside two (227 KB)
    assert resources.stages_dq_for_bulk_add(256, 64, 64, 1, hopper)
    assert not resources.stages_dq_for_bulk_add(256, 64, 64, 2, hopper)
    assert resources.dq_staging_bytes(128, 64) == 4 * 64 * (128 + 8)
    assert "cutlass::bfloat16_t, true, false>;" in render.render_spec(backward["sm_90", 128])
    assert "cutlass::bfloat16_t, false, true>;" in render.render_spec(backward["sm_90", 32])


def test_the_backward_step_gets_a_mask_free_copy_where_a_thread_holds_many_scores():
    config = load_config(paths.DEFAULT_CONFIG)
    split = {(s.arch, s.head_dim)
             for s in enumerate_specs(config, kinds=["bwd"], family_names=["mma"])
             if mma.template_context(s)["mask_free_step"]}
    # 128 x 128 tiles over 8 warps: 64 scores per thread; 64 x 128 and 64 x 64 hold 32 and 16
    assert split == {("sm_80", 32), ("sm_90", 32), ("sm_90", 64)}
    assert resources.has_mask_free_step(128, 128, 8)
    assert not resources.has_mask_free_step(64, 128, 8)
    assert not resources.has_mask_free_step(128, 128, 16)


def test_hopper_render_passes_its_switches_as_cpp_booleans(specs):
    spec = next(s for s in specs if s.family == "hopper" and s.kind == "fwd" and s.head_dim == 128
                and s.score_mod == "none" and s.variant is None and not s.dropout)
    text = render.render_spec(spec)
    assert ("flashgen::hopper::FwdTraits<128, 128, 128, 2, cutlass::bfloat16_t, true, true, "
            "cutlass::bfloat16_t>" in text)
    assert ("flashgen::hopper::launch_fwd<Traits, flashgen::CausalMask, flashgen::IdentityScore, "
            "flashgen::NoDropout>" in text)


def test_hopper_defines_extended_wgmma_shapes_only_where_a_gemm_needs_them(specs):
    """CuTe's wider set of wgmma n costs compile time, so only tiles with an n outside its base
    shapes (block_n 80 at head dim 256, 112 at 192) pull it in."""
    define = "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"
    hopper = {s.head_dim: render.render_spec(s) for s in specs
              if s.family == "hopper" and s.kind != "fwd_fp8"}
    assert sorted(hd for hd, text in hopper.items() if define in text) == [192, 256]
    assert not any(define in render.render_spec(s) for s in specs if s.kind == "fwd_fp8")
    text = hopper[256]
    assert text.index(define) < text.index('#include "flashgen/hopper/fwd_launch.cuh"')
    assert hopper_resources.needs_extended_wgmma_shapes(128, 176)
    assert hopper_resources.needs_extended_wgmma_shapes(80, 128)
    assert not hopper_resources.needs_extended_wgmma_shapes(96, 64)


def test_hopper_backward_renders_its_traits_and_launch():
    config = load_config(paths.DEFAULT_CONFIG)
    by_mod = {s.score_mod: s for s in enumerate_specs(
        config, kinds=["bwd"], family_names=["hopper"], head_dims=[128], dtypes=["bf16"],
        masks=["none"], dropout=False)}
    alibi, added, plain, biased, capped, both = (
        by_mod[m] for m in ("alibi", "bias", "none", "relative_bias", "softcap", "softcap_alibi"))
    text = render.render_spec(plain)
    assert "flashgen::hopper::BwdTraits<128, 80, 128, 2, true, cutlass::bfloat16_t>" in text
    # S^T's and dQ^T's n is 80, outside CuTe's base wgmma shapes
    assert "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in text
    # the score modifiers keep the head dim's tile (the mask's table keeps to score_mods none)
    for spec in (alibi, added, biased, capped, both):
        assert spec.tile.block_m == 64, spec.name
    launch = "flashgen::hopper::launch_bwd<Traits, flashgen::NoMask, flashgen::"
    assert f"{launch}IdentityScore, flashgen::NoDropout>" in text
    assert f"{launch}Softcap, flashgen::NoDropout>" in render.render_spec(capped)
    assert f"{launch}Alibi, flashgen::NoDropout>" in render.render_spec(alibi)
    assert f"{launch}SoftcapAlibi, flashgen::NoDropout>" in render.render_spec(both)
    assert f"{launch}ScoreBias, flashgen::NoDropout>" in render.render_spec(added)
    (dropped,) = enumerate_specs(config, kinds=["bwd"], family_names=["hopper"],
                                 head_dims=[128], dtypes=["bf16"], masks=["none"],
                                 score_mods=["none"], dropout=True)
    assert f"{launch}IdentityScore, flashgen::Dropout>" in render.render_spec(dropped)
    # a config-defined score modifier: its struct, then the launch that wraps it
    biased_text = render.render_spec(biased)
    assert "struct relative_bias {" in biased_text and "flashgen_mask_ranges" not in biased_text
    assert ("launch_bwd<Traits, flashgen::NoMask, flashgen::VariantScore<"
            "flashgen::variants::relative_bias>, flashgen::NoDropout>" in biased_text)
    (causal,) = enumerate_specs(config, kinds=["bwd"], family_names=["hopper"], head_dims=[128],
                                dtypes=["bf16"], masks=["causal"], score_mods=["none"],
                                dropout=False)
    assert "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" not in render.render_spec(causal)


def test_a_variants_decode_kernel_carries_its_struct_but_computes_no_block_ranges(specs):
    """Decode kernels visit every cached key: they take the variant's struct, not its ranges."""
    spec = next(s for s in specs if s.kind == "kvcache" and s.mask == "document")
    text = render.render_spec(spec)
    assert "struct document {" in text and "flashgen_mask_ranges" not in text
    assert not spec.computes_mask_ranges
    assert next(s for s in specs if s.kind == "fwd" and s.mask == "document").computes_mask_ranges
