"""A kernel spec: one compiled kernel, one name, one generated file, one cache entry."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from codegen import families
from codegen.config import Config
from codegen.family import Family, Tile


@dataclass(frozen=True, order=True)
class KernelSpec:
    family: str     # "mma": which templates, codegen/families/
    kind: str       # "fwd" | "bwd": which of the family's templates
    arch: str       # "sm_90": the gencode target and the config table the tile came from
    dtype: str      # "fp16" | "bf16"
    head_dim: int
    mask: str       # "none" | "causal": codegen/masks.py
    tile: Tile      # the kind's tile (its fields are the config keys)

    @cached_property
    def name(self) -> str:
        """Encodes every compile-time parameter, e.g. fwd_mma_sm90_bf16_hd128_causal_m128n64w4s2."""
        arch = self.arch.replace("_", "")
        return (f"{self.kind}_{self.family}_{arch}_{self.dtype}_hd{self.head_dim}_{self.mask}_"
                f"{self.tile.suffix}")

    @property
    def family_record(self) -> Family:
        return families.FAMILIES[self.family]


KINDS = ("fwd", "bwd", "decode")


def enumerate_specs(config: Config, archs=None, head_dims=None, dtypes=None, masks=None,
                    kinds=None, family_names=None, alt_tiles=True) -> list[KernelSpec]:
    """All specs of the config, sorted, optionally filtered (None keeps everything); with
    alt_tiles=False only the main tiles' (one spec per family, kind, arch, dtype, head dim and
    mask)."""
    specs = [
        KernelSpec(family, kind, arch, dtype, head_dim, mask, tile)
        for (family, kind, arch, head_dim), _ in config.tiles
        for mask in config.masks
        for tile in config.tiles_of(family, kind, arch, head_dim, mask)[:None if alt_tiles else 1]
        for dtype in config.dtypes
    ]
    return sorted(
        s for s in specs
        if (archs is None or s.arch in archs)
        and (head_dims is None or s.head_dim in head_dims)
        and (dtypes is None or s.dtype in dtypes)
        and (masks is None or s.mask in masks)
        and (kinds is None or s.kind in kinds)
        and (family_names is None or s.family in family_names)
    )
