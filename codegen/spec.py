"""A kernel spec: one compiled kernel, one name, one generated file, one cache entry."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from codegen import families
from codegen.config import Config
from codegen.family import Family, Tile
from codegen.score_mods import SCORE_MODS


@dataclass(frozen=True, order=True)
class KernelSpec:
    family: str     # "mma": which templates, codegen/families/
    kind: str       # "fwd" | "bwd": which of the family's templates
    arch: str       # "sm_90": the gencode target and the config table the tile came from
    dtype: str      # "fp16" | "bf16"
    head_dim: int
    mask: str       # "none" | "causal": codegen/masks.py
    tile: Tile      # the kind's tile (its fields are the config keys)
    score_mod: str = "none"  # codegen/score_mods.py

    @cached_property
    def name(self) -> str:
        """Encodes every compile-time parameter, e.g. fwd_mma_sm90_bf16_hd128_causal_m128n64w4s2
        (a score modifier follows the mask: ..._causal_softcap_m128...)."""
        arch = self.arch.replace("_", "")
        score_mod = "" if self.score_mod == "none" else f"{self.score_mod}_"
        return (f"{self.kind}_{self.family}_{arch}_{self.dtype}_hd{self.head_dim}_{self.mask}_"
                f"{score_mod}{self.tile.suffix}")

    @property
    def family_record(self) -> Family:
        return families.FAMILIES[self.family]


KINDS = ("fwd", "bwd", "decode")


def configured_specs(config: Config, alt_tiles=True) -> list[KernelSpec]:
    """Every spec of the config, unsorted: each (family, kind, arch, head dim, mask)'s tiles in
    the config's order (with alt_tiles=False only the main one), for every dtype and each score
    modifier its kind takes."""
    return [
        KernelSpec(family, kind, arch, dtype, head_dim, mask, tile, score_mod)
        for (family, kind, arch, head_dim), _ in config.tiles
        for mask in config.masks
        for score_mod in config.score_mods if kind in SCORE_MODS[score_mod].kinds
        for tile in config.tiles_of(family, kind, arch, head_dim, mask)[:None if alt_tiles else 1]
        for dtype in config.dtypes
    ]


def enumerate_specs(config: Config, archs=None, head_dims=None, dtypes=None, masks=None,
                    kinds=None, family_names=None, alt_tiles=True,
                    score_mods=None) -> list[KernelSpec]:
    """All specs of the config, sorted, optionally filtered (None keeps everything); with
    alt_tiles=False only the main tiles' (one spec per family, kind, arch, dtype, head dim and
    mask)."""
    return sorted(
        s for s in configured_specs(config, alt_tiles)
        if (archs is None or s.arch in archs)
        and (head_dims is None or s.head_dim in head_dims)
        and (dtypes is None or s.dtype in dtypes)
        and (masks is None or s.mask in masks)
        and (kinds is None or s.kind in kinds)
        and (family_names is None or s.family in family_names)
        and (score_mods is None or s.score_mod in score_mods)
    )
