"""A kernel spec: one compiled kernel, one name, one generated file, one cache entry."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from codegen import resources
from codegen.arch import ARCHS
from codegen.config import Config, Tile


@dataclass(frozen=True, order=True)
class KernelSpec:
    arch: str       # "sm_90": the gencode target and the config table the tile came from
    dtype: str      # "fp16" | "bf16"
    head_dim: int
    causal: bool
    tile: Tile
    direction: str = "fwd"  # "fwd" | "bwd": which kernel template

    @cached_property
    def name(self) -> str:
        """Encodes every compile-time parameter, e.g. fwd_sm90_bf16_hd128_causal_m128n64w4s2."""
        mask = "causal" if self.causal else "full"
        arch = self.arch.replace("_", "")
        return f"{self.direction}_{arch}_{self.dtype}_hd{self.head_dim}_{mask}_{self.tile.suffix}"

    @property
    def family(self) -> str:
        return ARCHS[self.arch].family

    @property
    def split_masked_loop(self) -> bool:
        """Forward only: the tiles that need a mask get a loop of their own (resources.py)."""
        return resources.splits_masked_loop(self.head_dim, self.block_m, self.block_n, self.warps)

    @property
    def dq_bulk_reduce(self) -> bool:
        """Backward only: dQ reaches its workspace by bulk reduce-adds (resources.py)."""
        return resources.stages_dq_for_bulk_add(self.head_dim, self.block_m, self.block_n,
                                                self.stages, ARCHS[self.arch])

    @property
    def split_masked_step(self) -> bool:
        """Backward only: the step has a copy without masking code (resources.py)."""
        return resources.splits_masked_step(self.block_m, self.block_n, self.warps)

    # Flat attribute access for templates and tables.
    block_m = property(lambda self: self.tile.block_m)
    block_n = property(lambda self: self.tile.block_n)
    warps = property(lambda self: self.tile.warps)
    stages = property(lambda self: self.tile.stages)


DIRECTIONS = ("fwd", "bwd")


def enumerate_specs(config: Config, archs=None, head_dims=None, dtypes=None, causal=None,
                    directions=None, variants=True) -> list[KernelSpec]:
    """All specs of the config, sorted, optionally filtered (None keeps everything); with
    variants=False, only the main tiles' (one spec per direction, arch, dtype, head dim, causal:
    what dispatch.select chooses among)."""
    tables = [("fwd", config.tiles), ("bwd", config.backward_tiles)]
    if variants:
        tables.append(("fwd", config.variant_tiles))
    specs = [
        KernelSpec(arch, dtype, head_dim, is_causal, tile, direction)
        for direction, tiles in tables
        for (arch, head_dim), tile in tiles
        for dtype in config.dtypes
        for is_causal in config.causal
    ]
    return sorted(
        s for s in specs
        if (archs is None or s.arch in archs)
        and (head_dims is None or s.head_dim in head_dims)
        and (dtypes is None or s.dtype in dtypes)
        and (causal is None or s.causal in causal)
        and (directions is None or s.direction in directions)
    )


def forward_candidates(config: Config, spec: KernelSpec) -> tuple[KernelSpec, ...]:
    """The forward kernels that can run the calls of a main-tile forward spec: that spec first,
    then one per variant tile of its head dim (flashgen/tile_choice.py picks per call)."""
    tiles = config.forward_tiles(spec.arch, spec.head_dim)
    return tuple(replace(spec, tile=tile) for tile in tiles)
