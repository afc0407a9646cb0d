"""The config file: which kernels exist and their tile shapes (TOML -> frozen dataclasses).

Layout of the file (see configs/default.toml):

    dtypes = ["fp16", "bf16"]
    causal = [false, true]
    [arch.sm_90.head_dim.128]
    block_m = 128
    block_n = 64
    warps = 4
    kv_stages = 2
    [[arch.sm_90.head_dim.128.variants]] # optional, repeatable: more forward tiles, chosen
    block_m = 64                         # per call by shape (flashgen/tile_choice.py)
    block_n = 64
    warps = 4
    kv_stages = 2
    [arch.sm_90.head_dim.128.backward]   # optional: the backward kernel's tile
    block_m = 64
    block_n = 128
    warps = 8
    q_stages = 2
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from codegen import resources
from codegen.arch import ARCHS

DTYPES = ("fp16", "bf16")
MAX_HEAD_DIM = 256
# The last key is the pipeline depth of the streamed operand: K/V tiles in the forward (which
# keeps Q), Q/dO tiles in the backward (which keeps K and V).
FORWARD_KEYS = ("block_m", "block_n", "warps", "kv_stages")
BACKWARD_KEYS = ("block_m", "block_n", "warps", "q_stages")
BACKWARD_TABLE = "backward"
VARIANTS_TABLE = "variants"


class ConfigError(ValueError):
    """A config that cannot be built; the message names the key and the limit."""


@dataclass(frozen=True, order=True)
class Tile:
    block_m: int
    block_n: int
    warps: int
    stages: int

    @property
    def suffix(self) -> str:
        return f"m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}"


@dataclass(frozen=True)
class Config:
    path: Path
    dtypes: tuple[str, ...]
    causal: tuple[bool, ...]
    # (arch, head_dim) -> tile, sorted; backward_tiles only for the head dims that have one
    tiles: tuple[tuple[tuple[str, int], Tile], ...]
    backward_tiles: tuple[tuple[tuple[str, int], Tile], ...] = ()
    # The extra forward tiles, sorted; a head dim may have several or none
    variant_tiles: tuple[tuple[tuple[str, int], Tile], ...] = ()

    def head_dims(self, arch: str) -> list[int]:
        return sorted(hd for (a, hd), _ in self.tiles if a == arch)

    def forward_tiles(self, arch: str, head_dim: int) -> tuple[Tile, ...]:
        """The head dim's main forward tile first, then its variants."""
        key = (arch, head_dim)
        return (dict(self.tiles)[key], *(tile for k, tile in self.variant_tiles if k == key))

    @property
    def archs(self) -> list[str]:
        return sorted({a for (a, _), _ in self.tiles})


def load_config(path: Path | str) -> Config:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse_config(raw, path)


def parse_config(raw: dict, path: Path) -> Config:
    def fail(where: str, message: str) -> ConfigError:
        return ConfigError(f"{path}: {where}: {message}")

    _reject_unknown(raw, {"dtypes", "causal", "arch"}, "top level", fail)
    dtypes = raw.get("dtypes", list(DTYPES))
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise fail("dtypes", f"{dtypes!r}: must be a non-empty list drawn from {list(DTYPES)}")
    causal = raw.get("causal", [False, True])
    if not isinstance(causal, list) or not causal or any(not isinstance(c, bool) for c in causal):
        raise fail("causal", f"{causal!r}: must be a non-empty list of true/false")

    arch_tables = raw.get("arch")
    if not isinstance(arch_tables, dict) or not arch_tables:
        raise fail("arch", "at least one [arch.sm_XX.head_dim.N] table is required")
    tiles, backward_tiles, variant_tiles = {}, {}, []
    for arch, table in arch_tables.items():
        if arch not in ARCHS:
            raise fail(f"arch.{arch}", f"unknown arch; known: {', '.join(ARCHS)}")
        _reject_unknown(table, {"head_dim"}, f"arch.{arch}", fail)
        for hd_key, tile_table in table.get("head_dim", {}).items():
            where = f"arch.{arch}.head_dim.{hd_key}"
            key = (arch, _parse_head_dim(hd_key, where, fail))
            tiles[key], backward, variants = _parse_head_dim_table(tile_table, *key, where, fail)
            if backward is not None:
                backward_tiles[key] = backward
            variant_tiles += ((key, tile) for tile in variants)
    return Config(path=path, dtypes=tuple(sorted(set(dtypes))),
                  causal=tuple(sorted(set(causal))), tiles=tuple(sorted(tiles.items())),
                  backward_tiles=tuple(sorted(backward_tiles.items())),
                  variant_tiles=tuple(sorted(variant_tiles)))


def _reject_unknown(table, allowed: set[str], where: str, fail) -> None:
    if not isinstance(table, dict):
        raise fail(where, "must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _parse_head_dim(key: str, where: str, fail) -> int:
    if not key.isdigit():
        raise fail(where, f"head dim {key!r} is not a whole number")
    head_dim = int(key)
    if head_dim <= 0 or head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise fail(where, f"head dim {head_dim} must be a multiple of 8 in 8..{MAX_HEAD_DIM}")
    return head_dim


def _parse_head_dim_table(table, arch: str, head_dim: int, where: str, fail):
    """(main forward tile, backward tile or None, forward variants) of one head dim's table."""
    forward = _parse_tile(table, FORWARD_KEYS, resources.tile_problems, head_dim, ARCHS[arch],
                          where, fail, subtables=(BACKWARD_TABLE, VARIANTS_TABLE))
    backward = None
    if BACKWARD_TABLE in table:
        backward = _parse_tile(table[BACKWARD_TABLE], BACKWARD_KEYS,
                               resources.backward_tile_problems, head_dim, ARCHS[arch],
                               f"{where}.{BACKWARD_TABLE}", fail)
    variants = _parse_variants(table.get(VARIANTS_TABLE, []), forward, head_dim, ARCHS[arch],
                               f"{where}.{VARIANTS_TABLE}", fail)
    return forward, backward, variants


def _parse_variants(tables, main: Tile, head_dim: int, arch, where: str, fail) -> list[Tile]:
    """The [[...variants]] array of forward tiles: each checked like the main tile, none twice."""
    if not isinstance(tables, list):
        raise fail(where, f"must be an array of tables: write each one as [[{where}]]")
    variants = []
    for i, table in enumerate(tables):
        tile = _parse_tile(table, FORWARD_KEYS, resources.tile_problems, head_dim, arch,
                           f"{where}[{i}]", fail)
        if tile == main or tile in variants:
            raise fail(f"{where}[{i}]", f"{tile.suffix} repeats "
                       f"{'the main tile' if tile == main else 'an earlier variant'}")
        variants.append(tile)
    return variants


def _parse_tile(table, keys: tuple[str, ...], tile_problems, head_dim: int, arch, where: str,
                fail, subtables: tuple[str, ...] = ()) -> Tile:
    _reject_unknown(table, set(keys) | set(subtables), where, fail)
    missing = [k for k in keys if k not in table]
    if missing:
        raise fail(where, f"missing key(s) {missing}")
    for key in keys:
        value = table[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise fail(f"{where}.{key}", f"{value!r} must be a positive integer")
    tile = Tile(*(table[k] for k in keys))
    problems = tile_problems(head_dim, tile.block_m, tile.block_n, tile.warps, tile.stages,
                             arch.smem_limit)
    if problems:
        raise fail(where, "; ".join(problems))
    return tile
