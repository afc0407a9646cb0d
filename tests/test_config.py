"""Config validation: good configs load, bad ones fail naming the key and the limit."""

from __future__ import annotations

import pytest

from codegen import paths
from codegen.arch import ARCHS
from codegen.config import ConfigError, load_config
from codegen.spec import enumerate_specs
from codegen.families import hopper
from codegen.families.hopper import resources as hopper_resources
from codegen.families.mma import BwdTile, FwdTile

TILE = "block_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"
BACKWARD = "[mma.sm_90.head_dim.64.backward]\n"
ALT = "[[mma.sm_90.head_dim.64.alt_tiles]]\n"
SMALL_TILE = "block_m = 64\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_default_config_declares_the_documented_head_dims():
    config = load_config(paths.DEFAULT_CONFIG)
    assert config.archs == ["sm_80", "sm_90"] and config.families == ["hopper", "mma"]
    for arch in config.archs:
        assert config.head_dims("mma", "fwd", arch) == [32, 64, 96, 128, 192, 256]
    assert config.head_dims("hopper", "fwd", "sm_90") == [64, 96, 128, 192, 256]
    assert config.dtypes == ("bf16", "fp16") and config.masks == ("causal", "none", "window")
    assert config.score_mods == ("alibi", "bias", "none", "softcap", "softcap_alibi")
    assert [v.name for v in config.variants] == ["block_sparse", "document", "head_window",
                                                "prefix_lm", "relative_bias"]


def test_default_config_has_a_backward_tile_per_head_dim():
    config = load_config(paths.DEFAULT_CONFIG)
    for arch in config.archs:
        assert config.head_dims("mma", "bwd", arch) == config.head_dims("mma", "fwd", arch)


def test_minimal_config(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.80]\n{TILE}"))
    assert config.tiles == ((("mma", "fwd", "sm_90", 80), (FwdTile(128, 64, 4, 2),)),)
    assert config.tiles_of("mma", "bwd", "sm_90", 80) == ()


def test_backward_table(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}"
                                         "block_m = 64\nblock_n = 128\nwarps = 8\nq_stages = 2\n"))
    assert config.tiles_of("mma", "bwd", "sm_90", 64) == (BwdTile(64, 128, 8, 2),)


def test_alt_tiles_follow_the_main_tile(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}"
                                         f"{ALT}block_m = 64\nblock_n = 128\nwarps = 4\n"
                                         "kv_stages = 2\n"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64) == (
        FwdTile(128, 64, 4, 2), FwdTile(64, 64, 4, 2), FwdTile(64, 128, 4, 2))


def test_a_head_dim_without_alt_tiles_has_its_main_tile_only(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64) == (FwdTile(128, 64, 4, 2),)


def test_a_mask_table_changes_that_masks_main_tile_only(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}"
                                         "[mma.sm_90.head_dim.64.causal]\nblock_m = 64\n"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "none") == (
        FwdTile(128, 64, 4, 2), FwdTile(64, 64, 4, 2))
    # The causal main tile equals the alt tile, which is not listed twice.
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "causal") == (FwdTile(64, 64, 4, 2),)
    assert config.tiles_of("mma", "fwd", "sm_90", 64) == (FwdTile(128, 64, 4, 2),
                                                          FwdTile(64, 64, 4, 2))
    specs = enumerate_specs(config, alt_tiles=False)
    assert {(s.mask, s.tile) for s in specs} == {("none", FwdTile(128, 64, 4, 2)),
                                                 ("causal", FwdTile(64, 64, 4, 2)),
                                                 ("window", FwdTile(128, 64, 4, 2))}


def test_a_masks_alt_tiles_replace_the_head_dims_for_that_mask_only(tmp_path):
    mask_alt = "[[mma.sm_90.head_dim.64.causal.alt_tiles]]\n"
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}"
                                         f"{mask_alt}block_m = 64\nblock_n = 32\nwarps = 4\n"
                                         "kv_stages = 2\n"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "none") == (
        FwdTile(128, 64, 4, 2), FwdTile(64, 64, 4, 2))
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "causal") == (
        FwdTile(128, 64, 4, 2), FwdTile(64, 32, 4, 2))
    # Alt tiles under a mask alone: the other masks build the main tile only.
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{mask_alt}{SMALL_TILE}"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "none") == (FwdTile(128, 64, 4, 2),)
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "causal") == (
        FwdTile(128, 64, 4, 2), FwdTile(64, 64, 4, 2))
    assert {(s.mask, s.tile) for s in enumerate_specs(config, kinds=["fwd"], dtypes=["bf16"])} == {
        ("none", FwdTile(128, 64, 4, 2)), ("causal", FwdTile(128, 64, 4, 2)),
        ("causal", FwdTile(64, 64, 4, 2)), ("window", FwdTile(128, 64, 4, 2))}


def test_the_mask_mod_table_gives_every_config_defined_mask_its_tiles(tmp_path):
    """A score modifier alone keeps its mask's tiles; the built-in masks keep theirs."""
    variants = ('[variants.doc]\nmask_mod = "kv_idx <= q_idx"\n'
                '[variants.shift]\nscore_mod = "score + 1"\nscore_mod_grad = "1"\n')
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}"
                                         "[mma.sm_90.head_dim.64.mask_mod]\nblock_m = 64\n"
                                         f"{variants}"))
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "mask_mod") == (FwdTile(64, 64, 4, 2),)
    specs = enumerate_specs(config, kinds=["fwd"], dtypes=["bf16"])
    assert {(s.mask, s.score_mod, s.tile.block_m) for s in specs} == {
        ("none", "none", 128), ("causal", "none", 128), ("window", "none", 128),
        ("doc", "none", 64),
        ("none", "shift", 128), ("causal", "shift", 128), ("window", "shift", 128)}


def test_a_mask_table_under_backward_changes_the_backward_tile(tmp_path):
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}"
                                         "block_m = 64\nblock_n = 128\nwarps = 8\nq_stages = 2\n"
                                         "[mma.sm_90.head_dim.64.backward.none]\nq_stages = 1\n"))
    assert config.tiles_of("mma", "bwd", "sm_90", 64, "none") == (BwdTile(64, 128, 8, 1),)
    assert config.tiles_of("mma", "bwd", "sm_90", 64, "causal") == (BwdTile(64, 128, 8, 2),)
    assert config.tiles_of("mma", "fwd", "sm_90", 64, "none") == (FwdTile(128, 64, 4, 2),)


def test_masks_select_the_mask_kinds(tmp_path):
    config = load_config(write(tmp_path, f'masks = ["causal"]\n[mma.sm_90.head_dim.64]\n{TILE}'))
    assert config.masks == ("causal",)


@pytest.mark.parametrize("text, message", [
    (f"[mma.sm_90.head_dim.84]\n{TILE}", "multiple of 8"),
    (f"[mma.sm_90.head_dim.264]\n{TILE}", "multiple of 8 in 8..256"),
    (f"[mma.sm_90.head_dim.abc]\n{TILE}", "not a whole number"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}colour = 1\n", r"unknown key\(s\) \['colour'\]"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 128\n", "missing key"),
    (f"[mma.sm_99.head_dim.64]\n{TILE}", r"mma: unknown key\(s\) \['sm_99'\]"),
    (f"[nofamily.sm_90.head_dim.64]\n{TILE}", "top level: unknown key"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}", r"now name their kernel family first: write \[mma"),
    (f"causal = [false, true]\n[mma.sm_90.head_dim.64]\n{TILE}", 'write masks = '),
    (f"masks = ['sliding']\n[mma.sm_90.head_dim.64]\n{TILE}", "masks"),
    ("[mma.sm_90.head_dim.64.backward]\nblock_m = 64\nblock_n = 128\nwarps = 8\nq_stages = 2\n",
     "missing key"),
    (f"extra = 1\n[mma.sm_90.head_dim.64]\n{TILE}", "top level"),
    (f"dtypes = ['fp8']\n[mma.sm_90.head_dim.64]\n{TILE}", "dtypes"),
    ("dtypes = ['bf16']\n", "at least one"),
    ("[mma.sm_90.head_dim.256]\nblock_m = 256\nblock_n = 128\nwarps = 8\nkv_stages = 3\n",
     "shared memory .* exceeds the arch limit of 232448"),
    ("[mma.sm_80.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 8\nkv_stages = 2\n",
     "exceeds the arch limit of 166912"),
    ("[mma.sm_90.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2\n",
     "accumulator registers"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 96\nblock_n = 64\nwarps = 4\nkv_stages = 2\n",
     "multiple of 16 \\* warps"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 40\nwarps = 4\nkv_stages = 2\n",
     "block_n = 40 must be a multiple of 16"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 1\n",
     "kv_stages = 1 must be at least 2"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64\nwarps = 0\nkv_stages = 2\n",
     "warps: 0 must be a positive integer"),
    ("[mma.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64.0\nwarps = 4\nkv_stages = 2\n",
     "block_n: 64.0 must be a positive integer"),
    ("not toml = = 1", "not valid TOML"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 8\n"
     "kv_stages = 2\n", r"head_dim.64.backward: unknown key\(s\) \['kv_stages'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 8\n"
     "q_stages = 3\n", "q_stages = 3 must be 1 or 2"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 48\nwarps = 8\n"
     "q_stages = 2\n", "block_n = 48 must be a multiple of 32"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 6\n"
     "q_stages = 2\n", "warps = 6 must be a power of two"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 16\nblock_n = 32\nwarps = 8\n"
     "q_stages = 2\n", "block_m x block_n = 16 x 32 does not split over 8 warps"),
    ("[mma.sm_80.head_dim.256]\nblock_m = 64\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"
     "[mma.sm_80.head_dim.256.backward]\nblock_m = 64\nblock_n = 64\nwarps = 8\nq_stages = 2\n",
     "backward: shared memory 212992 bytes exceeds the arch limit of 166912"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 128\nblock_n = 128\nwarps = 4\n"
     "q_stages = 1\n", "accumulator registers"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}q_stages = 2\n",
     r"head_dim.64.alt_tiles\[0\]: unknown key\(s\) \['q_stages'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}block_m = 64\nblock_n = 64\nwarps = 4\n",
     r"head_dim.64.alt_tiles\[0\]: missing key\(s\) \['kv_stages'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}{ALT}block_m = 64\n"
     "block_n = 64\nwarps = 0\nkv_stages = 2\n",
     r"head_dim.64.alt_tiles\[1\].warps: 0 must be a positive integer"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}block_m = 64\nblock_n = 64\nwarps = 8\n"
     "kv_stages = 2\n", r"alt_tiles\[0\]: block_m = 64 must be a multiple of 16 \* warps"),
    (f"[mma.sm_90.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 8\nkv_stages = 2\n"
     "[[mma.sm_90.head_dim.256.alt_tiles]]\nblock_m = 128\nblock_n = 128\nwarps = 8\n"
     "kv_stages = 3\n",
     r"head_dim.256.alt_tiles\[0\]: shared memory .* exceeds the arch limit of 232448"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{TILE}",
     r"alt_tiles\[0\]: m128n64w4s2 repeats the main tile"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}{ALT}{SMALL_TILE}",
     r"alt_tiles\[1\]: m64n64w4s2 repeats an earlier alt tile"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.causal]\nq_stages = 1\n",
     r"head_dim.64.causal: unknown key\(s\) \['q_stages'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.causal]\nblock_n = 40\n",
     r"head_dim.64.causal: block_n = 40 must be a multiple of 16"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.causal]\nblock_n = 64\n",
     r"head_dim.64.causal: repeats the main tile m128n64w4s2: delete the table"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}{ALT}{SMALL_TILE}"
     f"[[mma.sm_90.head_dim.64.causal.alt_tiles]]\n{SMALL_TILE}",
     r"head_dim.64.causal: repeats the main tile m128n64w4s2 and the alt tiles: delete the table"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[[mma.sm_90.head_dim.64.causal.alt_tiles]]\n{TILE}",
     r"head_dim.64.causal.alt_tiles\[0\]: m128n64w4s2 repeats the main tile"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.backward]\n"
     "block_m = 64\nblock_n = 128\nwarps = 8\nq_stages = 2\n"
     f"[[mma.sm_90.head_dim.64.backward.causal.alt_tiles]]\n{SMALL_TILE}",
     r"head_dim.64.backward.causal: unknown key\(s\) \['alt_tiles'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.sliding]\nblock_n = 32\n",
     r"head_dim.64: unknown key\(s\) \['sliding'\]"),
    (f"[mma.sm_90.head_dim.64]\n{TILE}[mma.sm_90.head_dim.64.alt_tiles]\n{SMALL_TILE}",
     r"head_dim.64.alt_tiles: must be an array of tables: write each one as "
     r"\[\[mma.sm_90.head_dim.64.alt_tiles\]\]"),
])
def test_invalid_configs_are_rejected(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(write(tmp_path, text))
    assert str(tmp_path) in str(info.value)  # names the file


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml")


def test_hopper_tiles_take_switches_as_booleans(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(HOPPER_TABLE.format(pingpong="false"))
    (spec, *_) = enumerate_specs(load_config(good), head_dims=[128])
    assert spec.tile.pingpong is False and spec.name.endswith("m128n128s2p0o1")
    bad = tmp_path / "bad.toml"
    bad.write_text(HOPPER_TABLE.format(pingpong="1"))
    with pytest.raises(ConfigError, match=r"pingpong: 1 must be true or false"):
        load_config(bad)


@pytest.mark.parametrize("overrides, message", [
    ({"block_m": 256}, r"64, 128 or 192"),
    ({"block_n": 120}, r"multiple of 16"),
    ({"kv_stages": 1}, r"at least 2"),
    ({"block_n": 256, "kv_stages": 4}, r"shared memory"),
])
def test_hopper_tiles_are_checked_before_nvcc(tmp_path, overrides, message):
    lines = HOPPER_TABLE.format(pingpong="true").splitlines()
    for key, value in overrides.items():
        lines = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in lines]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


HOPPER_TABLE = """dtypes = ["bf16"]
masks = ["none"]
[hopper.sm_90.head_dim.128]
block_m = 128
block_n = 128
kv_stages = 2
pingpong = {pingpong}
overlap = true
"""


HOPPER_BACKWARD_TABLE = HOPPER_TABLE.format(pingpong="true") + """[hopper.sm_90.head_dim.128.backward]
block_m = 64
block_n = 128
q_stages = 2
dq_before_dk = true
"""


@pytest.mark.parametrize("overrides, message", [
    ({"block_n": 192}, r"block_n = 192: one consumer warpgroup per 64 keys, so 64 or 128"),
    ({"block_m": 72}, r"block_m = 72: a multiple of 16 from 64 to 128"),
    # 96 rows transposed fit the registers, not three Q stages beside one of dO, dS and dQ's
    # staging in halves
    ({"block_m": 96, "q_stages": 3}, r"shared memory"),
    ({"q_stages": 8}, r"shared memory"),
    # dQ cannot split 128 rows over 2 consumers by columns: 64 rows each need block_m = 128
    ({"block_m": 128}, r"accumulator registers"),
])
def test_hopper_backward_tiles_are_checked_before_nvcc(tmp_path, overrides, message):
    lines = HOPPER_BACKWARD_TABLE.splitlines()
    in_backward = False
    for i, line in enumerate(lines):
        in_backward = in_backward or line.endswith(".backward]")
        key = line.split(" =")[0]
        if in_backward and key in overrides:
            lines[i] = f"{key} = {overrides[key]}"
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_hopper_backward_dq_splits_by_rows_or_whole_atom_columns(tmp_path):
    """dQ splits over the consumers by 64 query rows or by head-dim columns in whole swizzle atoms,
    the first consumer's share the larger where the atoms do not halve (head dim 96: 64 and 32 of
    32-column atoms); head dim 64 is one atom, so its block_m 64 cannot split dQ, and one
    consumer cannot take 128 rows."""
    assert hopper_resources.backward_dq_share_cols(96, 64, 128) == (64, 32)
    assert hopper_resources.backward_dq_share_cols(128, 64, 128) == (64, 64)
    assert hopper_resources.backward_dq_share_cols(64, 128, 128) == (64, 64)  # 64 rows each
    assert hopper_resources.backward_dq_share_cols(256, 64, 64) == (128, 128)
    table = HOPPER_BACKWARD_TABLE.replace("head_dim.128", "head_dim.64")
    with pytest.raises(ConfigError, match=r"whole 64-column swizzle atoms, at least one each"):
        load_config(write(tmp_path, table))
    path = tmp_path / "bad.toml"
    path.write_text(HOPPER_BACKWARD_TABLE.replace("block_m = 64\nblock_n = 128\nq_stages",
                                                  "block_m = 128\nblock_n = 64\nq_stages"))
    with pytest.raises(ConfigError, match=r"dQ splits over the 1 consumer"):
        load_config(path)


def test_hopper_backward_transposed_dq_needs_64_columns_per_consumer(tmp_path):
    """block_m 80 computes dQ transposed, 64 head-dim columns per consumer warpgroup: head dim
    128 over two consumers fits (the default's tile without a mask), head dim 64 does not."""
    table = HOPPER_BACKWARD_TABLE.replace("block_m = 64\nblock_n = 128\nq_stages",
                                          "block_m = 80\nblock_n = 128\nq_stages")
    assert load_config(write(tmp_path, table)).tiles_of("hopper", "bwd", "sm_90", 128)[0].block_m \
        == 80
    path = tmp_path / "bad.toml"
    path.write_text(table.replace("head_dim.128", "head_dim.64"))
    with pytest.raises(ConfigError, match=r"computes dQ transposed.*head_dim must be 128"):
        load_config(path)


@pytest.mark.parametrize("head_dim", [192, 256])
def test_hopper_backward_above_head_dim_128_splits_the_head_dim_of_64_keys(tmp_path, head_dim):
    """Two consumers share 64 keys of 64 query rows and split head dims 192 and 256 in halves of
    whole swizzle atoms; other tiles, and head dims whose halves are no wgmma n of whole atoms,
    are refused (without a backward table their gradients run on the mma family)."""
    table = HOPPER_BACKWARD_TABLE.replace("head_dim.128", f"head_dim.{head_dim}").replace(
        "block_n = 128\nq_stages", "block_n = 64\nq_stages").replace(
        "block_n = 128\nkv_stages", "block_n = 80\nkv_stages")  # the forward's hd256 tile
    tiles = load_config(write(tmp_path, table)).tiles_of("hopper", "bwd", "sm_90", head_dim)
    assert tiles[0] == hopper.BwdTile(block_m=64, block_n=64, q_stages=2, dq_before_dk=True)
    for bad in (table.replace("block_n = 64\nq_stages", "block_n = 128\nq_stages"),
                table.replace(f"head_dim.{head_dim}", "head_dim.160")):
        path = tmp_path / "bad.toml"
        path.write_text(bad)
        with pytest.raises(ConfigError, match=r"two consumer warpgroups share 64 keys"):
            load_config(path)


@pytest.mark.parametrize("head_dim, block_m, block_n, q_stages, plan", [
    (64, 128, 128, 2, (2, 2, 1)),   # dO as deep as Q, two staging buffers
    (128, 80, 128, 2, (2, 1, 1)),   # one buffer
    (128, 64, 128, 4, (1, 1, 1)),   # one dO stage
    (128, 96, 128, 2, (1, 1, 2)),   # a share staged in halves
    (192, 64, 64, 2, (2, 1, 1)),    # split by the head dim: staged only where deterministic
    (256, 64, 64, 2, (2, 0, 1)),    # dO as deep as Q before the staging buffer
    (256, 64, 64, 1, (1, 1, 1)),
])
def test_hopper_backward_memory_plan_keeps_q_stages_first(head_dim, block_m, block_n, q_stages,
                                                          plan):
    """(dO stages, dQ staging buffers, pieces per share): what bwd_traits.cuh gives up, in
    order, to fit 227 KB."""
    limit = ARCHS["sm_90"].smem_limit
    assert hopper_resources.backward_memory_plan(head_dim, block_m, block_n, q_stages,
                                                 limit) == plan
    assert hopper_resources.backward_shared_bytes(head_dim, block_m, block_n, q_stages,
                                                  *plan) <= limit


def test_a_mask_table_kept_to_some_score_modifiers_leaves_the_others_the_head_dims_tile(
        tmp_path):
    table = ('score_mods = ["none", "softcap"]\n' + HOPPER_BACKWARD_TABLE
             + '[hopper.sm_90.head_dim.128.backward.none]\nblock_m = 80\nscore_mods = ["none"]\n')
    config = load_config(write(tmp_path, table))
    tiles = {m: config.tiles_of("hopper", "bwd", "sm_90", 128, "none", m)[0].block_m
             for m in ("none", "softcap")}
    assert tiles == {"none": 80, "softcap": 64}
    assert {(s.score_mod, s.tile.block_m) for s in enumerate_specs(config, kinds=["bwd"])} == {
        ("none", 80), ("softcap", 64)}


@pytest.mark.parametrize("score_mods, message", [
    ('["cap"]', r"backward.none.score_mods: unknown score modifier\(s\) \['cap'\]"),
    ('"none"', r"backward.none.score_mods: 'none': must be a non-empty list"),
    ("[]", r"must be a non-empty list of score modifier names"),
])
def test_a_mask_tables_score_mods_must_name_known_modifiers(tmp_path, score_mods, message):
    table = HOPPER_BACKWARD_TABLE + ("[hopper.sm_90.head_dim.128.backward.none]\nblock_m = 80\n"
                                     f"score_mods = {score_mods}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, table))


def test_skip_blocks_marks_a_mask_with_holes_and_renders_into_its_struct(tmp_path):
    config = load_config(paths.DEFAULT_CONFIG)
    assert [v.name for v in config.variants if v.skip_blocks] == ["block_sparse"]
    assert "static constexpr bool kSkipBlocks = true;" in config.variant("block_sparse").cpp()
    assert "static constexpr bool kSkipBlocks = false;" in config.variant("document").cpp()
    table = '[variants.v]\nmask_mod = "true"\nskip_blocks = 1\n'
    with pytest.raises(ValueError, match=r"variants.v.skip_blocks: must be true or false"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))
    table = '[variants.v]\nscore_mod = "score"\nscore_mod_grad = "1"\nskip_blocks = true\n'
    with pytest.raises(ValueError, match="skip_blocks: goes with a mask_mod"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))


def test_a_variants_kvcache_builds_its_kv_cache_kernels(tmp_path):
    config = load_config(paths.DEFAULT_CONFIG)
    assert [v.name for v in config.variants if v.kvcache] == ["document", "head_window",
                                                             "relative_bias"]
    assert config.variant("document").kinds == ("fwd", "bwd", "kvcache")
    assert config.variant("prefix_lm").kinds == ("fwd", "bwd")
    table = '[variants.v]\nmask_mod = "true"\nkvcache = 1\n'
    with pytest.raises(ValueError, match=r"variants.v.kvcache: must be true or false"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))
    renamed = '[variants.v]\nmask_mod = "true"\ndecode = true\n'
    with pytest.raises(ValueError, match=r"variants.v.decode: is called kvcache = true now"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{renamed}"))


def test_a_mask_mod_that_reads_h_gets_a_block_mask_per_head():
    from flashgen.variants import block_mask_shape

    config = load_config(paths.DEFAULT_CONFIG)
    head_window, document = config.variant("head_window"), config.variant("document")
    assert [v.name for v in config.variants if v.per_head] == ["head_window"]
    assert "static constexpr bool kPerHead = true;" in head_window.cpp()
    assert "static constexpr bool kPerHead = false;" in document.cpp()
    # (batch, heads or 1, groups of 16 query rows, 4 + 2 bitmaps of 4 words over 300 keys)
    assert block_mask_shape(head_window, 2, 8, 100, 300) == (2, 8, 7, 12)
    assert block_mask_shape(document, 2, 8, 100, 300) == (2, 1, 7, 12)


def test_a_variants_dropout_builds_its_kernels_again_with_dropout(tmp_path):
    """A variant's own dropout = true, apart from the config's (which covers built-in kernels)."""
    table = '[variants.v]\nmask_mod = "kv_idx <= q_idx"\ndropout = true\n'
    config = load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))
    assert not config.dropout and config.variant("v").dropout
    specs = enumerate_specs(config)
    assert {s.dropout for s in specs if s.variant} == {False, True}
    assert not any(s.dropout and s.variant is None for s in specs)
    assert sorted((s.kind, s.dtype) for s in specs if s.dropout) == [("fwd", "bf16"),
                                                                      ("fwd", "fp16")]
    table = '[variants.v]\nmask_mod = "true"\ndropout = "yes"\n'
    with pytest.raises(ValueError, match=r"variants.v.dropout: must be true or false"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))


def test_a_dim_over_a_number_counts_blocks_rounded_up(tmp_path):
    layout = load_config(paths.DEFAULT_CONFIG).variant("block_sparse").tensors[0]
    assert layout.dims == ("batch", "seqlen_q/128", "seqlen_k/128")
    sizes = {"batch": 2, "heads": 8, "heads_kv": 2, "seqlen_q": 1000, "seqlen_k": 1025}
    assert layout.expected_shape(sizes) == (2, 8, 9)
    table = '[variants.v]\ntensors = { t = "int32[seqlen_x/128]" }\nmask_mod = "true"\n'
    with pytest.raises(ValueError, match="over a number"):
        load_config(write(tmp_path, f"[mma.sm_90.head_dim.64]\n{TILE}{table}"))
