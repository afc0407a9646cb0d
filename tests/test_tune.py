"""The tuner's choices, without a GPU: candidates, winner selection, config rewriting."""

from __future__ import annotations

import types

import pytest

from codegen import paths
from codegen.arch import ARCHS
from codegen.config import ConfigError, load_config
from codegen.families.mma import FAMILY, BwdTile, FwdTile, resources
from flashgen.tools import tune

HEAD_DIMS = [32, 64, 96, 128, 192, 256]


def main_tile(config, arch, head_dim, kind="fwd"):
    return config.tiles_of("mma", kind, arch, head_dim)[0]


def without(config, key):
    """The config's tiles except those of key = (family, kind, arch, head_dim)."""
    return {k: v for k, v in config.tiles if k != key}


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_set_tile_changes_only_that_table(arch, head_dim, kind):
    text = paths.DEFAULT_CONFIG.read_text()
    default = main_tile(load_config(paths.DEFAULT_CONFIG), arch, head_dim, kind)
    assert tune.set_tile(text, "mma", kind, arch, head_dim, default) == text


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_candidates_all_fit_and_include_the_default(arch, head_dim, kind):
    tiles = tune.candidate_tiles("mma", kind, arch, head_dim)
    assert tiles
    assert all(type(t) is FAMILY.kind(kind).tile for t in tiles)
    for t in tiles:
        if kind == "fwd":
            assert not resources.tile_problems(head_dim, t.block_m, t.block_n, t.warps,
                                               t.kv_stages, ARCHS[arch].smem_limit)
        else:
            assert not resources.backward_tile_problems(head_dim, t.block_m, t.block_n, t.warps,
                                                        t.q_stages, ARCHS[arch].smem_limit)
    assert main_tile(load_config(paths.DEFAULT_CONFIG), arch, head_dim, kind) in tiles


def test_a_family_without_a_grid_has_no_candidates(monkeypatch):
    monkeypatch.setattr(tune, "GRIDS", {})
    with pytest.raises(ValueError, match="no tile grid for family mma kind fwd"):
        tune.candidate_tiles("mma", "fwd", "sm_90", 128)


def row(head_dim, tile, dtype, mask, tflops=None, skipped=None, kind="fwd"):
    r = {"family": "mma", "kind": kind, "head_dim": head_dim, "tile": tile, "dtype": dtype,
         "mask": mask}
    if tflops is not None:
        r["tflops"] = tflops
    if skipped:
        r["skipped"] = skipped
    return r


def test_winner_has_best_geometric_mean_over_every_cell():
    rows = [
        row(128, "m128n64w4s2", "bf16", "none", 300),
        row(128, "m128n64w4s2", "bf16", "causal", 250),
        # Faster without a mask, much slower causal: loses on the geometric mean.
        row(128, "m128n128w8s2", "bf16", "none", 320),
        row(128, "m128n128w8s2", "bf16", "causal", 200),
        # Fastest where it ran, but it spilled on causal: not eligible.
        row(128, "m64n64w4s2", "bf16", "none", 400),
        row(128, "m64n64w4s2", "bf16", "causal", skipped="spills 8 bytes of registers"),
        row(64, "m128n64w4s3", "bf16", "none", skipped="wrong result"),
    ]
    # hd 64: no eligible tile
    winners = tune.pick_winners(rows)
    assert winners == {("mma", "fwd", 128): FwdTile(128, 64, 4, 2)}
    assert type(winners[("mma", "fwd", 128)]) is FwdTile


def test_winners_are_picked_per_kind():
    rows = [row(128, "m128n64w4s2", "bf16", "none", 300),
            row(128, "m64n128w8s2", "bf16", "none", 200, kind="bwd"),
            row(128, "m128n128w8s1", "bf16", "none", 150, kind="bwd")]
    winners = tune.pick_winners(rows)
    assert winners == {("mma", "fwd", 128): FwdTile(128, 64, 4, 2),
                       ("mma", "bwd", 128): BwdTile(64, 128, 8, 2)}
    assert type(winners[("mma", "bwd", 128)]) is BwdTile


def test_a_mask_keeps_its_own_winner_when_it_differs():
    rows = [row(128, "m128n64w4s2", dtype, "none", 300) for dtype in ("bf16", "fp16")]
    rows += [row(128, "m128n64w4s2", dtype, "causal", 200) for dtype in ("bf16", "fp16")]
    rows += [row(128, "m64n64w4s2", dtype, "none", 250) for dtype in ("bf16", "fp16")]
    rows += [row(128, "m64n64w4s2", dtype, "causal", 220) for dtype in ("bf16", "fp16")]
    assert tune.pick_winners(rows) == {("mma", "fwd", 128): FwdTile(128, 64, 4, 2)}
    assert tune.pick_mask_winners(rows) == {("mma", "fwd", 128, "none"): FwdTile(128, 64, 4, 2),
                                            ("mma", "fwd", 128, "causal"): FwdTile(64, 64, 4, 2)}


def test_set_mask_tile_writes_the_keys_that_differ_and_removes_a_redundant_table(tmp_path):
    from codegen.families.hopper import FwdTile as HopperTile

    text = paths.DEFAULT_CONFIG.read_text()
    main = HopperTile(128, 128, 2, True, True)
    assert load_config(paths.DEFAULT_CONFIG).tiles_of("hopper", "fwd", "sm_90", 128)[0] == main
    causal = HopperTile(128, 64, 3, True, True)
    new = tune.set_mask_tile(text, "hopper", "fwd", "sm_90", 128, "causal", main, causal)
    assert "[hopper.sm_90.head_dim.128.causal]\nblock_n = 64\nkv_stages = 3\n" in new
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    tuned = load_config(path)
    assert tuned.tiles_of("hopper", "fwd", "sm_90", 128, "causal") == (causal,)
    assert tuned.tiles_of("hopper", "fwd", "sm_90", 128, "none") == (main,)
    for same in (None, main):
        gone = tune.set_mask_tile(new, "hopper", "fwd", "sm_90", 128, "causal", main, same)
        assert "head_dim.128.causal]" not in gone
        assert gone.count("# ") == text.count("# ")
        path.write_text(gone)
        assert load_config(path).tiles_of("hopper", "fwd", "sm_90", 128, "causal") == (main,)


def test_set_mask_tile_keeps_the_score_modifiers_a_table_keeps_to(tmp_path):
    from codegen.families.hopper import BwdTile as HopperBwdTile

    text = paths.DEFAULT_CONFIG.read_text()
    config = load_config(paths.DEFAULT_CONFIG)
    main = config.tiles_of("hopper", "bwd", "sm_90", 128)[0]
    assert config.tiles_of("hopper", "bwd", "sm_90", 128, "none", "none")[0].block_m == 80
    tuned_tile = HopperBwdTile(80, 128, 2, False)
    new = tune.set_mask_tile(text, "hopper", "bwd", "sm_90", 128, "none", main, tuned_tile)
    assert ('[hopper.sm_90.head_dim.128.backward.none]\nblock_m = 80\ndq_before_dk = false\n'
            'score_mods = ["none"]\n') in new
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    tuned = load_config(path)
    assert tuned.tiles_of("hopper", "bwd", "sm_90", 128, "none", "none") == (tuned_tile,)
    assert tuned.tiles_of("hopper", "bwd", "sm_90", 128, "none", "softcap") == (main,)


@pytest.mark.parametrize("tile", [FwdTile(128, 64, 8, 3), BwdTile(64, 128, 8, 2)])
def test_parse_tile_inverts_suffix(tile):
    assert tune.parse_tile(tile.suffix, type(tile)) == tile
    assert type(tune.parse_tile(tile.suffix, type(tile))) is type(tile)
    with pytest.raises(ValueError):
        tune.parse_tile("m128n64", type(tile))
    with pytest.raises(ValueError):
        tune.parse_tile("m128n64w4s2x1", type(tile))


def test_set_tile_rewrites_one_table_and_keeps_the_rest(tmp_path):
    text = paths.DEFAULT_CONFIG.read_text()
    new = tune.set_tile(text, "mma", "fwd", "sm_80", 128, FwdTile(64, 128, 4, 2))
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    tuned, old = load_config(path), load_config(paths.DEFAULT_CONFIG)
    key = ("mma", "fwd", "sm_80", 128)
    assert main_tile(tuned, "sm_80", 128) == FwdTile(64, 128, 4, 2)
    assert without(tuned, key) == without(old, key)
    assert new.count("# ") == text.count("# ")  # comments survive
    # the alt tiles stay as written
    assert tuned.tiles_of(*key)[1:] == old.tiles_of(*key)[1:]
    assert old.tiles_of(*key)[1:]


def test_a_winner_equal_to_an_alt_tile_is_refused_naming_it(tmp_path):
    """The tuner tunes the main tile only; `flashgen tune --write` checks the config loads."""
    path = tmp_path / "tuned.toml"
    path.write_text(tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "mma", "fwd", "sm_80", 128,
                                  FwdTile(64, 64, 4, 2)))
    with pytest.raises(ConfigError, match=r"mma.sm_80.head_dim.128.alt_tiles\[0\]: m64n64w4s2 "
                                          "repeats the main tile"):
        load_config(path)


def test_set_tile_appends_a_missing_table(tmp_path):
    new = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "mma", "fwd", "sm_90", 80,
                        FwdTile(128, 64, 4, 2))
    assert "\n[mma.sm_90.head_dim.80]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2\n" \
        in new
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    assert load_config(path).tiles_of("mma", "fwd", "sm_90", 80) == (FwdTile(128, 64, 4, 2),)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_set_backward_tile_changes_only_that_table(arch, head_dim, tmp_path):
    text = paths.DEFAULT_CONFIG.read_text()
    config = load_config(paths.DEFAULT_CONFIG)
    default = main_tile(config, arch, head_dim, "bwd")
    assert tune.set_tile(text, "mma", "bwd", arch, head_dim, default) == text
    others = [t for t in tune.candidate_tiles("mma", "bwd", arch, head_dim) if t != default]
    if not others:  # sm_80 at head dim 256: one backward tile fits its shared memory
        assert (arch, head_dim) == ("sm_80", 256)
        return
    tile = others[0]
    path = tmp_path / "tuned.toml"
    path.write_text(tune.set_tile(text, "mma", "bwd", arch, head_dim, tile))
    tuned = load_config(path)
    key = ("mma", "bwd", arch, head_dim)
    assert tuned.tiles_of(*key) == (tile,)
    assert without(tuned, key) == without(config, key)


def test_set_backward_tile_appends_a_missing_table(tmp_path):
    new = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "mma", "bwd", "sm_90", 80,
                        BwdTile(64, 64, 8, 2))
    assert "\n[mma.sm_90.head_dim.80.backward]\nblock_m = 64\nblock_n = 64\nwarps = 8\n" \
        "q_stages = 2\n" in new
    new = tune.set_tile(new, "mma", "fwd", "sm_90", 80, FwdTile(128, 64, 4, 2))
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    config = load_config(path)
    assert config.tiles_of("mma", "bwd", "sm_90", 80) == (BwdTile(64, 64, 8, 2),)
    assert config.tiles_of("mma", "fwd", "sm_90", 80) == (FwdTile(128, 64, 4, 2),)


def test_hopper_candidates_fit_and_include_the_default():
    from codegen.families import hopper

    config = load_config(paths.DEFAULT_CONFIG)
    for head_dim in config.head_dims("hopper", "fwd", "sm_90"):
        tiles = tune.candidate_tiles("hopper", "fwd", "sm_90", head_dim)
        assert all(type(t) is hopper.FwdTile for t in tiles)
        assert config.tiles_of("hopper", "fwd", "sm_90", head_dim)[0] in tiles
        assert all(not hopper.resources.tile_problems(head_dim, t.block_m, t.block_n,
                                                      t.kv_stages, ARCHS["sm_90"].smem_limit)
                   for t in tiles)


def test_hopper_tiles_round_trip_through_suffix_and_config(tmp_path):
    from codegen.families.hopper import FwdTile as HopperTile

    tile = HopperTile(192, 64, 3, False, True)
    assert tune.parse_tile(tile.suffix, HopperTile) == tile
    assert tune.parse_tile(tile.suffix, HopperTile).pingpong is False
    text = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "hopper", "fwd", "sm_90", 96, tile)
    assert "[hopper.sm_90.head_dim.96]\nblock_m = 192\nblock_n = 64\nkv_stages = 3\n" \
           "pingpong = false\noverlap = true\n" in text
    path = tmp_path / "tuned.toml"
    path.write_text(text)
    assert load_config(path).tiles_of("hopper", "fwd", "sm_90", 96)[0] == tile


def test_hopper_backward_candidates_fit_and_include_the_default():
    from codegen.families import hopper

    config = load_config(paths.DEFAULT_CONFIG)
    head_dims = config.head_dims("hopper", "bwd", "sm_90")
    assert head_dims == [64, 96, 128, 192, 256]
    for head_dim in head_dims:
        tiles = tune.candidate_tiles("hopper", "bwd", "sm_90", head_dim)
        assert all(type(t) is hopper.BwdTile for t in tiles)
        assert config.tiles_of("hopper", "bwd", "sm_90", head_dim)[0] in tiles
        assert all(not hopper.resources.backward_tile_problems(
            head_dim, t.block_m, t.block_n, t.q_stages, ARCHS["sm_90"].smem_limit)
            for t in tiles)


def test_tune_direction_selects_the_backward_kind(monkeypatch):
    """`flashgen tune --direction bwd` is `--kind bwd`: only backward candidates are swept."""
    from flashgen import cli

    parser = cli._parser()
    args = parser.parse_args(["tune", "--direction", "bwd", "--family", "hopper"])
    assert args.direction == ["bwd"] and args.kind is None


def test_tune_sweeps_only_the_kinds_with_a_grid(monkeypatch):
    """Without --kind, every kind that has a tile grid (decode tiles are set by hand)."""
    torch = pytest.importorskip("torch")

    from flashgen import cli

    swept = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(tune, "sweep", lambda specs, seqlen: swept.extend(specs) or [])
    assert cli.main(["tune", "--family", "mma", "--head-dim", "128", "--dtype", "bf16",
                     "--mask", "none"]) == 0
    assert {s.kind for s in swept} == {"fwd", "bwd"}


def test_a_candidate_ptxas_serialised_is_not_eligible(monkeypatch):
    """C7512 (wgmma serialised for want of registers) builds a kernel that runs, slowly."""
    resources = {"registers": 168, "spill_bytes": 0, "stack_bytes": 0}
    entry = types.SimpleNamespace(resources=resources)
    monkeypatch.setattr(tune.cache, "find_entry", lambda spec: entry)
    assert tune._unusable(None) is None
    resources["wgmma_serialised"] = True
    assert "(C7512)" in tune._unusable(None)


def test_e4m3_forward_candidates_fit_step_32_keys_and_include_the_default():
    from codegen.families import hopper

    config = load_config(paths.DEFAULT_CONFIG)
    head_dims = config.head_dims("hopper", "fwd_fp8", "sm_90")
    assert head_dims == [64, 128, 256]
    for head_dim in head_dims:
        tiles = tune.candidate_tiles("hopper", "fwd_fp8", "sm_90", head_dim)
        assert config.tiles_of("hopper", "fwd_fp8", "sm_90", head_dim)[0] in tiles
        assert all(t.block_n % 32 == 0 and not hopper.resources.tile_problems(
            head_dim, t.block_m, t.block_n, t.kv_stages, ARCHS["sm_90"].smem_limit, fp8=True)
            for t in tiles)
    text = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "hopper", "fwd_fp8", "sm_90", 128,
                         hopper.FwdTile(128, 192, 3, True, True))
    assert "[hopper.sm_90.head_dim.128.fp8]\nblock_m = 128\nblock_n = 192\nkv_stages = 3\n" in text


def test_tune_direction_takes_the_e4m3_forward():
    from flashgen import cli

    args = cli._parser().parse_args(["tune", "--direction", "fwd_fp8"])
    assert args.direction == ["fwd_fp8"]
