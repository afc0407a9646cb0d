"""A kernel spec: one compiled kernel, one name, one generated file, one cache entry."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from codegen import families
from codegen.config import MASK_MOD_TILES, Config
from codegen.family import Family, Tile
from codegen.masks import MASKS, MaskKind
from codegen.score_mods import SCORE_MODS, ScoreModKind
from codegen.variants import Variant


@dataclass(frozen=True, order=True)
class KernelSpec:
    family: str     # "mma": which templates, codegen/families/
    kind: str       # "fwd" | "bwd": which of the family's templates
    arch: str       # "sm_90": the gencode target and the config table the tile came from
    dtype: str      # "fp16" | "bf16"; of an e4m3 forward (fwd_fp8), its output's
    head_dim: int
    mask: str       # "none" | "causal" | "window" (codegen/masks.py) | a variant's name
    tile: Tile      # the kind's tile (its fields are the config keys)
    score_mod: str = "none"  # codegen/score_mods.py, or a variant's name
    variant: Variant | None = None  # the config-defined variant whose mask or score mod it runs
    dropout: bool = False  # applies dropout to the probabilities (common/dropout.cuh)

    @cached_property
    def name(self) -> str:
        """Encodes every compile-time parameter, e.g. fwd_mma_sm90_bf16_hd128_causal_m128n64w4s2
        (a score modifier follows the mask, then dropout: ..._causal_softcap_dropout_m128...)."""
        arch = self.arch.replace("_", "")
        score_mod = "" if self.score_mod == "none" else f"{self.score_mod}_"
        dropout = "dropout_" if self.dropout else ""
        return (f"{self.kind}_{self.family}_{arch}_{self.dtype}_hd{self.head_dim}_{self.mask}_"
                f"{score_mod}{dropout}{self.tile.suffix}")

    @property
    def family_record(self) -> Family:
        return families.FAMILIES[self.family]

    @property
    def mask_kind(self) -> MaskKind:
        if self.variant is not None and self.mask == self.variant.name:
            return self.variant.mask_kind
        return MASKS[self.mask]

    @property
    def dropout_type(self) -> str:
        """The dropout policy the templates instantiate (common/dropout.cuh)."""
        return "flashgen::Dropout" if self.dropout else "flashgen::NoDropout"

    @property
    def computes_mask_ranges(self) -> bool:
        """Whether its library carries the entry that computes its variant mask's block ranges
        (common/variant.cuh; the forward and backward kernels read them, decode kernels not)."""
        return self.variant is not None and bool(self.variant.mask_mod) and self.kind != "kvcache"

    @property
    def score_mod_kind(self) -> ScoreModKind:
        if self.variant is not None and self.score_mod == self.variant.name:
            return self.variant.score_mod_kind
        return SCORE_MODS[self.score_mod]


KINDS = ("fwd", "bwd", "kvcache", "fwd_fp8")


def configured_specs(config: Config, alt_tiles=True) -> list[KernelSpec]:
    """Every spec of the config, unsorted: each (family, kind, arch, head dim, mask)'s tiles in
    the config's order (with alt_tiles=False only the main one), for every dtype and each score
    modifier its kind takes; then each config-defined variant's (variant_axes); with the config's
    `dropout` the built-in ones, and with a variant's own `dropout` that variant's, of the kinds
    that take it again with dropout."""
    return [
        KernelSpec(family, kind, arch, dtype, head_dim, mask, tile, score_mod, variant, dropout)
        for (family, kind, arch, head_dim), _ in config.tiles
        for variant, masks, score_mods in variant_axes(config)
        if variant is None or kind in variant.kinds and (not variant.head_dims
                                                         or head_dim in variant.head_dims)
        for mask in masks
        for score_mod in score_mods if variant or kind in SCORE_MODS[score_mod].kinds
        for tile in config.tiles_of(family, kind, arch, head_dim, tile_mask(mask, variant),
                                    score_mod)[:None if alt_tiles else 1]
        for dtype in config.dtypes
        for dropout in (False, True)[:2 if takes_dropout(config, family, kind, variant) else 1]
    ]


def tile_mask(mask: str, variant: Variant | None) -> str | None:
    """The per-mask subtable whose tiles a kernel of this mask takes where the config has one: a
    built-in mask's own, or for a config-defined mask the `mask_mod` subtable (config.py)."""
    if mask in MASKS:
        return mask
    return MASK_MOD_TILES if variant is not None and variant.mask_mod else None


def takes_dropout(config: Config, family: str, kind: str, variant: Variant | None) -> bool:
    """Whether the config builds this family's kernels of this kind, built-in (variant None) or
    a variant's, with dropout too."""
    wanted = config.dropout if variant is None else variant.dropout
    return wanted and kind in families.FAMILIES[family].dropout_kinds


def variant_axes(config: Config):
    """(variant, masks, score modifiers) of the config's kernels: the built-in ones (variant
    None), then per variant its own mask (with no score modifier, or its own), or, for a score
    modifier alone, that modifier under each configured mask. Their tiles: tile_mask's."""
    yield None, config.masks, config.score_mods
    for variant in config.variants:
        score_mods = (variant.name,) if variant.score_mod else ("none",)
        yield variant, (variant.name,) if variant.mask_mod else config.masks, score_mods


def enumerate_specs(config: Config, archs=None, head_dims=None, dtypes=None, masks=None,
                    kinds=None, family_names=None, alt_tiles=True,
                    score_mods=None, dropout=None) -> list[KernelSpec]:
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
        and (dropout is None or s.dropout == dropout)
    )
