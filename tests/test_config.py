"""Config validation: good configs load, bad ones fail naming the key and the limit."""

from __future__ import annotations

import pytest

from codegen import paths
from codegen.config import ConfigError, Tile, load_config

TILE = "block_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"
BACKWARD = "[arch.sm_90.head_dim.64.backward]\n"
VARIANT = "[[arch.sm_90.head_dim.64.variants]]\n"
SMALL_TILE = "block_m = 64\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_default_config_declares_the_documented_head_dims():
    config = load_config(paths.DEFAULT_CONFIG)
    assert config.archs == ["sm_80", "sm_90"]
    for arch in config.archs:
        assert config.head_dims(arch) == [32, 64, 96, 128, 192, 256]
    assert config.dtypes == ("bf16", "fp16") and config.causal == (False, True)


def test_default_config_has_a_backward_tile_per_head_dim():
    config = load_config(paths.DEFAULT_CONFIG)
    assert [key for key, _ in config.backward_tiles] == [key for key, _ in config.tiles]


def test_minimal_config(tmp_path):
    config = load_config(write(tmp_path, f"[arch.sm_90.head_dim.80]\n{TILE}"))
    assert config.tiles == ((("sm_90", 80), Tile(128, 64, 4, 2)),)
    assert config.backward_tiles == ()


def test_backward_table(tmp_path):
    config = load_config(write(tmp_path, f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}"
                                         "block_m = 64\nblock_n = 128\nwarps = 8\nq_stages = 2\n"))
    assert config.backward_tiles == ((("sm_90", 64), Tile(64, 128, 8, 2)),)


def test_variants_follow_the_main_tile(tmp_path):
    config = load_config(write(tmp_path, f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}{SMALL_TILE}"
                                         f"{VARIANT}block_m = 64\nblock_n = 128\nwarps = 4\n"
                                         "kv_stages = 2\n"))
    assert config.tiles == ((("sm_90", 64), Tile(128, 64, 4, 2)),)
    assert config.forward_tiles("sm_90", 64) == (Tile(128, 64, 4, 2), Tile(64, 64, 4, 2),
                                                 Tile(64, 128, 4, 2))


def test_a_head_dim_without_variants_has_its_main_tile_only(tmp_path):
    config = load_config(write(tmp_path, f"[arch.sm_90.head_dim.64]\n{TILE}"))
    assert config.variant_tiles == ()
    assert config.forward_tiles("sm_90", 64) == (Tile(128, 64, 4, 2),)


@pytest.mark.parametrize("text, message", [
    (f"[arch.sm_90.head_dim.84]\n{TILE}", "multiple of 8"),
    (f"[arch.sm_90.head_dim.264]\n{TILE}", "multiple of 8 in 8..256"),
    (f"[arch.sm_90.head_dim.abc]\n{TILE}", "not a whole number"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}colour = 1\n", r"unknown key\(s\) \['colour'\]"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 128\n", "missing key"),
    (f"[arch.sm_99.head_dim.64]\n{TILE}", "unknown arch"),
    (f"extra = 1\n[arch.sm_90.head_dim.64]\n{TILE}", "top level"),
    (f"dtypes = ['fp8']\n[arch.sm_90.head_dim.64]\n{TILE}", "dtypes"),
    (f"causal = [1]\n[arch.sm_90.head_dim.64]\n{TILE}", "causal"),
    ("dtypes = ['bf16']\n", "at least one"),
    ("[arch.sm_90.head_dim.256]\nblock_m = 256\nblock_n = 128\nwarps = 8\nkv_stages = 3\n",
     "shared memory .* exceeds the arch limit of 232448"),
    ("[arch.sm_80.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 8\nkv_stages = 2\n",
     "exceeds the arch limit of 166912"),
    ("[arch.sm_90.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2\n",
     "accumulator registers"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 96\nblock_n = 64\nwarps = 4\nkv_stages = 2\n",
     "multiple of 16 \\* warps"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 40\nwarps = 4\nkv_stages = 2\n",
     "block_n = 40 must be a multiple of 16"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 1\n",
     "kv_stages = 1 must be at least 2"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64\nwarps = 0\nkv_stages = 2\n",
     "warps: 0 must be a positive integer"),
    ("[arch.sm_90.head_dim.64]\nblock_m = 128\nblock_n = 64.0\nwarps = 4\nkv_stages = 2\n",
     "block_n: 64.0 must be a positive integer"),
    ("not toml = = 1", "not valid TOML"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 8\n"
     "kv_stages = 2\n", r"head_dim.64.backward: unknown key\(s\) \['kv_stages'\]"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 8\n"
     "q_stages = 3\n", "q_stages = 3 must be 1 or 2"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 48\nwarps = 8\n"
     "q_stages = 2\n", "block_n = 48 must be a multiple of 32"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 64\nblock_n = 128\nwarps = 6\n"
     "q_stages = 2\n", "warps = 6 must be a power of two"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 16\nblock_n = 32\nwarps = 8\n"
     "q_stages = 2\n", "block_m x block_n = 16 x 32 does not split over 8 warps"),
    ("[arch.sm_80.head_dim.256]\nblock_m = 64\nblock_n = 64\nwarps = 4\nkv_stages = 2\n"
     "[arch.sm_80.head_dim.256.backward]\nblock_m = 64\nblock_n = 64\nwarps = 8\nq_stages = 2\n",
     "backward: shared memory 212992 bytes exceeds the arch limit of 166912"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{BACKWARD}block_m = 128\nblock_n = 128\nwarps = 4\n"
     "q_stages = 1\n", "accumulator registers"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}{SMALL_TILE}q_stages = 2\n",
     r"head_dim.64.variants\[0\]: unknown key\(s\) \['q_stages'\]"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}block_m = 64\nblock_n = 64\nwarps = 4\n",
     r"head_dim.64.variants\[0\]: missing key\(s\) \['kv_stages'\]"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}{SMALL_TILE}{VARIANT}block_m = 64\n"
     "block_n = 64\nwarps = 0\nkv_stages = 2\n",
     r"head_dim.64.variants\[1\].warps: 0 must be a positive integer"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}block_m = 64\nblock_n = 64\nwarps = 8\n"
     "kv_stages = 2\n", r"variants\[0\]: block_m = 64 must be a multiple of 16 \* warps"),
    (f"[arch.sm_90.head_dim.256]\nblock_m = 128\nblock_n = 64\nwarps = 8\nkv_stages = 2\n"
     "[[arch.sm_90.head_dim.256.variants]]\nblock_m = 128\nblock_n = 128\nwarps = 8\n"
     "kv_stages = 3\n",
     r"head_dim.256.variants\[0\]: shared memory .* exceeds the arch limit of 232448"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}{TILE}",
     r"variants\[0\]: m128n64w4s2 repeats the main tile"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}{VARIANT}{SMALL_TILE}{VARIANT}{SMALL_TILE}",
     r"variants\[1\]: m64n64w4s2 repeats an earlier variant"),
    (f"[arch.sm_90.head_dim.64]\n{TILE}[arch.sm_90.head_dim.64.variants]\n{SMALL_TILE}",
     r"head_dim.64.variants: must be an array of tables: write each one as "
     r"\[\[arch.sm_90.head_dim.64.variants\]\]"),
])
def test_invalid_configs_are_rejected(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(write(tmp_path, text))
    assert str(tmp_path) in str(info.value)  # names the file


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml")
