"""The tuner's choices, without a GPU: candidates, winner selection, config rewriting."""

from __future__ import annotations

import pytest

from codegen import paths, resources
from codegen.arch import ARCHS
from codegen.config import ConfigError, Tile, load_config
from flashgen import tune


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_set_tile_changes_only_that_table(arch, head_dim):
    text = paths.DEFAULT_CONFIG.read_text()
    default = dict(load_config(paths.DEFAULT_CONFIG).tiles)[(arch, head_dim)]
    assert tune.set_tile(text, arch, head_dim, default) == text


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_candidates_all_fit_and_include_the_default(arch, head_dim, direction):
    tiles = tune.candidate_tiles(arch, head_dim, direction)
    assert tiles
    problems = {"fwd": resources.tile_problems, "bwd": resources.backward_tile_problems}[direction]
    for t in tiles:
        assert not problems(head_dim, t.block_m, t.block_n, t.warps, t.stages,
                            ARCHS[arch].smem_limit)
    config = load_config(paths.DEFAULT_CONFIG)
    defaults = config.tiles if direction == "fwd" else config.backward_tiles
    assert dict(defaults)[(arch, head_dim)] in tiles


def row(head_dim, tile, dtype, causal, tflops=None, skipped=None, direction="fwd"):
    r = {"direction": direction, "head_dim": head_dim, "tile": tile, "dtype": dtype,
         "causal": causal}
    if tflops is not None:
        r["tflops"] = tflops
    if skipped:
        r["skipped"] = skipped
    return r


def test_winner_has_best_geometric_mean_over_every_cell():
    rows = [
        row(128, "m128n64w4s2", "bf16", False, 300), row(128, "m128n64w4s2", "bf16", True, 250),
        # Faster non-causal, much slower causal: loses on the geometric mean.
        row(128, "m128n128w8s2", "bf16", False, 320), row(128, "m128n128w8s2", "bf16", True, 200),
        # Fastest where it ran, but it spilled on causal: not eligible.
        row(128, "m64n64w4s2", "bf16", False, 400),
        row(128, "m64n64w4s2", "bf16", True, skipped="spills 8 bytes of registers"),
        row(64, "m128n64w4s3", "bf16", False, skipped="wrong result"),
    ]
    # hd 64: no eligible tile
    assert tune.pick_winners(rows) == {("fwd", 128): Tile(128, 64, 4, 2)}


def test_winners_are_picked_per_direction():
    rows = [row(128, "m128n64w4s2", "bf16", False, 300),
            row(128, "m64n128w8s2", "bf16", False, 200, direction="bwd"),
            row(128, "m128n128w8s1", "bf16", False, 150, direction="bwd")]
    assert tune.pick_winners(rows) == {("fwd", 128): Tile(128, 64, 4, 2),
                                       ("bwd", 128): Tile(64, 128, 8, 2)}


def test_parse_tile_inverts_suffix():
    tile = Tile(128, 64, 8, 3)
    assert tune.parse_tile(tile.suffix) == tile
    with pytest.raises(ValueError):
        tune.parse_tile("m128n64")


def test_set_tile_rewrites_one_table_and_keeps_the_rest(tmp_path):
    text = paths.DEFAULT_CONFIG.read_text()
    new = tune.set_tile(text, "sm_90", 128, Tile(64, 128, 4, 3))
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    tiles = dict(load_config(path).tiles)
    assert tiles[("sm_90", 128)] == Tile(64, 128, 4, 3)
    old = dict(load_config(paths.DEFAULT_CONFIG).tiles)
    assert {k: v for k, v in tiles.items() if k != ("sm_90", 128)} == \
        {k: v for k, v in old.items() if k != ("sm_90", 128)}
    assert new.count("# ") == text.count("# ")  # comments survive
    assert load_config(path).variant_tiles == load_config(paths.DEFAULT_CONFIG).variant_tiles


def test_a_winner_equal_to_a_variant_is_refused_naming_it(tmp_path):
    """The tuner tunes the main tile only; `flashgen tune --write` checks the config loads."""
    path = tmp_path / "tuned.toml"
    path.write_text(tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "sm_90", 128,
                                  Tile(64, 64, 4, 2)))
    with pytest.raises(ConfigError, match=r"head_dim.128.variants\[0\]: m64n64w4s2 repeats the "
                                          "main tile"):
        load_config(path)


def test_set_tile_appends_a_missing_table(tmp_path):
    new = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "sm_90", 80, Tile(128, 64, 4, 2))
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    assert dict(load_config(path).tiles)[("sm_90", 80)] == Tile(128, 64, 4, 2)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_set_backward_tile_changes_only_that_table(arch, head_dim, tmp_path):
    text = paths.DEFAULT_CONFIG.read_text()
    config = load_config(paths.DEFAULT_CONFIG)
    default = dict(config.backward_tiles)[(arch, head_dim)]
    assert tune.set_tile(text, arch, head_dim, default, "bwd") == text
    others = [t for t in tune.candidate_tiles(arch, head_dim, "bwd") if t != default]
    if not others:  # sm_80 at head dim 256: one backward tile fits its shared memory
        assert (arch, head_dim) == ("sm_80", 256)
        return
    tile = others[0]
    path = tmp_path / "tuned.toml"
    path.write_text(tune.set_tile(text, arch, head_dim, tile, "bwd"))
    tuned = load_config(path)
    assert dict(tuned.backward_tiles)[(arch, head_dim)] == tile
    assert tuned.tiles == config.tiles


def test_set_backward_tile_appends_a_missing_table(tmp_path):
    new = tune.set_tile(paths.DEFAULT_CONFIG.read_text(), "sm_90", 80, Tile(64, 64, 8, 2), "bwd")
    new = tune.set_tile(new, "sm_90", 80, Tile(128, 64, 4, 2))
    path = tmp_path / "tuned.toml"
    path.write_text(new)
    config = load_config(path)
    assert dict(config.backward_tiles)[("sm_90", 80)] == Tile(64, 64, 8, 2)
    assert dict(config.tiles)[("sm_90", 80)] == Tile(128, 64, 4, 2)
