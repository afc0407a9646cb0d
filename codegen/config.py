"""The config file: which kernels exist and their tiles (TOML -> frozen dataclasses).

Layout of the file (see configs/default.toml):

    dtypes = ["fp16", "bf16"]
    masks = ["none", "causal"]
    score_mods = ["none", "softcap"]    # optional: score modifiers built (codegen/score_mods.py)
    dropout = true                      # optional: the dropout twins of the built-in kernels
    [mma.sm_90.head_dim.128]            # family mma, arch sm_90, head dim 128: its forward tile
    block_m = 128
    block_n = 64
    warps = 4
    kv_stages = 2
    [[mma.sm_90.head_dim.128.alt_tiles]] # optional, repeatable: more forward tiles, chosen per
    block_m = 64                         # call by shape (flashgen/families/mma/tile_choice.py)
    block_n = 64
    warps = 4
    kv_stages = 2
    [mma.sm_90.head_dim.128.backward]   # optional: the backward kernel's tile
    block_m = 64
    block_n = 128
    warps = 8
    q_stages = 2
    [mma.sm_90.head_dim.128.causal]     # optional, per mask kind: keys of the main tile that
    block_n = 128                       # differ for that mask's kernels (same count of kernels)
    [[mma.sm_90.head_dim.128.causal.alt_tiles]]  # optional: that mask's alt tiles, in place of
    block_m = 64                                 # the head dim's
    [hopper.sm_90.head_dim.64.mask_mod] # optional: the same for the kernels of every config-
    block_m = 128                       # defined mask (a [variants.<name>] with a mask_mod)
    [hopper.sm_90.head_dim.128.backward.none]  # a mask's subtable may keep to some score
    block_m = 80                               # modifiers (built-in, or a variant's name); its
    score_mods = ["none"]                      # other kernels take the head dim's tiles
    ...

Each family (codegen/families/) says which kinds of kernel a head-dim table holds, under which
subtable, with which keys and resource checks; this module only walks the tables.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from codegen import families
from codegen.arch import ARCHS
from codegen.family import Family, Kind, Tile
from codegen.masks import MASKS
from codegen.score_mods import SCORE_MODS
from codegen.variants import Variant, parse_variants

DTYPES = ("fp16", "bf16")
MAX_HEAD_DIM = 256
ALT_TILES = "alt_tiles"
# The per-mask subtable that holds the tiles of config-defined masks' kernels (codegen/spec.py's
# tile_mask): one for all of them, so that a mask added to the config gets them too.
MASK_MOD_TILES = "mask_mod"
# The key of a mask's subtable that keeps it to some score modifiers' kernels.
SCORE_MODS_KEY = "score_mods"


class ConfigError(ValueError):
    """A config that cannot be built; the message names the key and the limit."""


TileKey = tuple[str, str, str, int]  # (family, kind, arch, head_dim)
MaskTileKey = tuple[str, str, str, int, str]  # (family, kind, arch, head_dim, mask)


@dataclass(frozen=True)
class Config:
    path: Path
    dtypes: tuple[str, ...]
    masks: tuple[str, ...]
    # (family, kind, arch, head_dim) -> its tiles, the main one first, then its alt tiles; sorted
    tiles: tuple[tuple[TileKey, tuple[Tile, ...]], ...]
    # (family, kind, arch, head_dim, mask) -> that mask's tiles (main first, then alt tiles)
    # where a [....<mask>] subtable changes them; sorted
    mask_tiles: tuple[tuple[MaskTileKey, tuple[Tile, ...]], ...] = ()
    # the same keys -> the score modifiers a mask's subtable keeps to (its `score_mods`), if any
    mask_score_mods: tuple[tuple[MaskTileKey, tuple[str, ...]], ...] = ()
    score_mods: tuple[str, ...] = ("none",)  # codegen/score_mods.py
    variants: tuple[Variant, ...] = ()  # codegen/variants.py, by name
    # Each built-in forward and backward kernel of a family that takes dropout (codegen/family.py)
    # is built a second time with it (common/dropout.cuh): calls with dropout_p > 0 run those.
    dropout: bool = False

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def tiles_of(self, family: str, kind: str, arch: str, head_dim: int,
                 mask: str | None = None, score_mod: str | None = None) -> tuple[Tile, ...]:
        """The main tile first, then the alt tiles (the mask's own where its table changes them
        for this score modifier); empty when not configured."""
        tiles = dict(self.tiles).get((family, kind, arch, head_dim), ())
        key = (family, kind, arch, head_dim, mask)
        kept_to = dict(self.mask_score_mods).get(key)
        if kept_to is not None and score_mod not in kept_to:
            return tiles
        return dict(self.mask_tiles).get(key, tiles)

    def head_dims(self, family: str, kind: str, arch: str) -> list[int]:
        return sorted(hd for (f, k, a, hd), _ in self.tiles if (f, k, a) == (family, kind, arch))

    @property
    def archs(self) -> list[str]:
        return sorted({a for (_, _, a, _), _ in self.tiles})

    @property
    def families(self) -> list[str]:
        return sorted({f for (f, _, _, _), _ in self.tiles})


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

    if "arch" in raw:
        raise fail("arch", "[arch.sm_XX.head_dim.N] tables now name their kernel family first: "
                   "write [mma.sm_XX.head_dim.N] (and [[...alt_tiles]] for [[...variants]])")
    if "causal" in raw:
        raise fail("causal", 'write masks = ["none", "causal"] instead of causal = [false, true]')
    _reject_unknown(raw, {"dtypes", "masks", "score_mods", "dropout", "variants",
                          *families.FAMILIES},
                    "top level", fail)
    dtypes = raw.get("dtypes", list(DTYPES))
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise fail("dtypes", f"{dtypes!r}: must be a non-empty list drawn from {list(DTYPES)}")
    masks = raw.get("masks", list(MASKS))
    if not isinstance(masks, list) or not masks or any(m not in MASKS for m in masks):
        raise fail("masks", f"{masks!r}: must be a non-empty list drawn from {list(MASKS)}")
    score_mods = raw.get("score_mods", ["none"])
    if (not isinstance(score_mods, list) or "none" not in score_mods
            or any(m not in SCORE_MODS for m in score_mods)):
        raise fail("score_mods", f"{score_mods!r}: must be a list drawn from {list(SCORE_MODS)} "
                   f"that holds \"none\" (the plain score)")
    dropout = raw.get("dropout", False)
    if not isinstance(dropout, bool):
        raise fail("dropout", f"{dropout!r}: must be true or false")

    tiles: dict[TileKey, tuple[Tile, ...]] = {}
    mask_tiles: dict[MaskTileKey, Tile] = {}
    mask_score_mods: dict[MaskTileKey, tuple[str, ...]] = {}
    for name, family in families.FAMILIES.items():
        if name in raw:
            family_tiles, family_mask_tiles, family_score_mods = _parse_family(raw[name], family,
                                                                               fail)
            tiles.update(family_tiles)
            mask_tiles.update(family_mask_tiles)
            mask_score_mods.update(family_score_mods)
    if not tiles:
        raise fail("top level", "at least one [<family>.sm_XX.head_dim.N] table is required, e.g. "
                   f"[mma.sm_90.head_dim.128]; families: {sorted(families.FAMILIES)}")
    variants = parse_variants(raw.get("variants", {}), fail)
    known = [*SCORE_MODS, *(v.name for v in variants if v.score_mod)]
    for (family, kind, arch, head_dim, mask), kept_to in mask_score_mods.items():
        unknown = [m for m in kept_to if m not in known]
        if unknown:
            table = families.FAMILIES[family].kind(kind).table
            raise fail(f"{family}.{arch}.head_dim.{head_dim}{'.' + table if table else ''}.{mask}."
                       f"{SCORE_MODS_KEY}",
                       f"unknown score modifier(s) {unknown}; known: {known}")
    return Config(path=path, dtypes=tuple(sorted(set(dtypes))), masks=tuple(sorted(set(masks))),
                  score_mods=tuple(sorted(set(score_mods))), variants=variants, dropout=dropout,
                  tiles=tuple(sorted(tiles.items())), mask_tiles=tuple(sorted(mask_tiles.items())),
                  mask_score_mods=tuple(sorted(mask_score_mods.items())))


def _parse_family(table, family: Family, fail) -> tuple[dict[TileKey, tuple[Tile, ...]],
                                                       dict[MaskTileKey, tuple[Tile, ...]],
                                                       dict[MaskTileKey, tuple[str, ...]]]:
    _reject_unknown(table, set(family.archs), family.name, fail)
    tiles, mask_tiles, mask_score_mods = {}, {}, {}
    for arch, arch_table in table.items():
        where = f"{family.name}.{arch}"
        _reject_unknown(arch_table, {"head_dim"}, where, fail)
        for hd_key, hd_table in arch_table.get("head_dim", {}).items():
            hd_where = f"{where}.head_dim.{hd_key}"
            head_dim = _parse_head_dim(hd_key, hd_where, fail)
            for kind in family.kinds:
                kind_tiles, own = _parse_kind(hd_table, kind, family, head_dim, ARCHS[arch],
                                              hd_where, fail)
                if kind_tiles:
                    tiles[(family.name, kind.name, arch, head_dim)] = kind_tiles
                for mask, (mask_kind_tiles, kept_to) in own.items():
                    key = (family.name, kind.name, arch, head_dim, mask)
                    mask_tiles[key] = mask_kind_tiles
                    if kept_to is not None:
                        mask_score_mods[key] = kept_to
    return tiles, mask_tiles, mask_score_mods


def _parse_kind(hd_table, kind: Kind, family: Family, head_dim: int, arch, where: str,
                fail) -> tuple[tuple[Tile, ...],
                               dict[str, tuple[tuple[Tile, ...], tuple[str, ...] | None]]]:
    """The kind's main tile and alt tiles in one head dim's table (() when absent and optional),
    and the tiles of each mask kind whose subtable changes them: its main tile (the keys that
    differ) and its alt tiles (its own [[...<mask>.alt_tiles]], else the head dim's), with the
    score modifiers the subtable keeps to (None: every one)."""
    if kind.table is None:
        table, subtables = hd_table, family.subtables
    else:
        table, subtables, where = hd_table.get(kind.table), (), f"{where}.{kind.table}"
        if table is None and not kind.required:
            return (), {}
    if table is None:
        raise fail(where, f"missing: every head dim needs its {kind.name} tile")
    alt_key = (ALT_TILES,) if kind.alt_tiles else ()
    masks = (*MASKS, MASK_MOD_TILES)
    main = _parse_tile(table, kind, head_dim, arch, where, fail, subtables + alt_key + masks)
    tiles = (main, *_parse_alt_tiles(table, kind, head_dim, arch, where, fail, main))
    own = {}
    for mask in masks:
        if mask not in table:
            continue
        mask_where, mask_table = f"{where}.{mask}", table[mask]
        _reject_unknown(mask_table, set(kind.tile.keys()) | set(alt_key) | {SCORE_MODS_KEY},
                        mask_where, fail)
        kept_to = mask_table.get(SCORE_MODS_KEY)
        if kept_to is not None and (not isinstance(kept_to, list) or not kept_to
                                    or not all(isinstance(m, str) for m in kept_to)):
            raise fail(f"{mask_where}.{SCORE_MODS_KEY}", f"{kept_to!r}: must be a non-empty list "
                       f"of score modifier names")
        merged = {key: mask_table.get(key, table[key]) for key in kind.tile.keys()}
        mask_main = _parse_tile(merged, kind, head_dim, arch, mask_where, fail)
        if ALT_TILES in mask_table:
            mask_alts = _parse_alt_tiles(mask_table, kind, head_dim, arch, mask_where, fail,
                                         mask_main)
        else:  # the head dim's, less one the mask's main tile now repeats
            mask_alts = [t for t in tiles[1:] if t != mask_main]
        mask_tiles = (mask_main, *mask_alts)
        if mask_tiles == tiles:
            raise fail(mask_where, f"repeats the main tile {main.suffix}"
                       f"{' and the alt tiles' if len(tiles) > 1 else ''}: delete the table")
        own[mask] = (mask_tiles, None if kept_to is None else tuple(kept_to))
    return tiles, own


def _parse_alt_tiles(table, kind: Kind, head_dim: int, arch, where: str, fail,
                     main: Tile) -> list[Tile]:
    """The [[<where>.alt_tiles]] of a kind that takes them, none repeating main or each other."""
    alts = []
    alt_tables = table.get(ALT_TILES, []) if kind.alt_tiles else []
    if not isinstance(alt_tables, list):
        raise fail(f"{where}.{ALT_TILES}", f"must be an array of tables: write each one as "
                   f"[[{where}.{ALT_TILES}]]")
    for i, alt_table in enumerate(alt_tables):
        tile = _parse_tile(alt_table, kind, head_dim, arch, f"{where}.{ALT_TILES}[{i}]", fail)
        if tile == main or tile in alts:
            raise fail(f"{where}.{ALT_TILES}[{i}]", f"{tile.suffix} repeats "
                       f"{'the main tile' if tile == main else 'an earlier alt tile'}")
        alts.append(tile)
    return alts


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


def _parse_tile(table, kind: Kind, head_dim: int, arch, where: str, fail,
                subtables: tuple[str, ...] = ()) -> Tile:
    keys = kind.tile.keys()
    _reject_unknown(table, set(keys) | set(subtables), where, fail)
    missing = [k for k in keys if k not in table]
    if missing:
        raise fail(where, f"missing key(s) {missing}")
    flags = kind.tile.flags()
    for key in keys:
        value = table[key]
        if key in flags:
            if not isinstance(value, bool):
                raise fail(f"{where}.{key}", f"{value!r} must be true or false")
        elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise fail(f"{where}.{key}", f"{value!r} must be a positive integer")
    tile = kind.tile(*(table[k] for k in keys))
    problems = kind.problems(head_dim, tile, arch)
    if problems:
        raise fail(where, "; ".join(problems))
    return tile
