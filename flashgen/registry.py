"""The kernels the active config declares ($FLASHGEN_CONFIG or the default), and dispatch over
them."""

from __future__ import annotations

import functools
from pathlib import Path

from codegen import families, paths
from codegen.config import Config, load_config
from codegen.spec import KernelSpec
from flashgen import dispatch


@functools.cache
def _load(path: Path) -> tuple[Config, tuple[KernelSpec, ...]]:
    config = load_config(path)
    specs = tuple(KernelSpec(family, kind, arch, dtype, head_dim, mask, tile)
                  for (family, kind, arch, head_dim), _ in config.tiles
                  for dtype in config.dtypes for mask in config.masks
                  for tile in config.tiles_of(family, kind, arch, head_dim, mask))
    return config, specs


def active_config() -> Config:
    return _load(paths.config_path())[0]


def specs() -> tuple[KernelSpec, ...]:
    """Every configured spec; each (family, kind, arch, dtype, head dim, mask)'s tiles in the
    config's order, the main tile first."""
    return _load(paths.config_path())[1]


def candidates(arch: str, kind: str, dtype: str, head_dim: int,
               mask: str) -> tuple[dispatch.Choice, ...]:
    """dispatch.candidates over the active config (its errors name the config), restricted to
    $FLASHGEN_FAMILY when set and that family can run the call (FLASHGEN_FAMILY=hopper forces
    the forward; gradients of a head dim without a hopper backward still run on a family that
    has one)."""
    forced = paths.forced_family()
    if forced is not None and forced not in families.FAMILIES:
        raise dispatch.DispatchError(
            f"flashgen: FLASHGEN_FAMILY={forced} names no kernel family; known: "
            f"{', '.join(sorted(families.FAMILIES))}")
    if forced is not None:
        try:
            return dispatch.candidates(specs(), arch, kind, dtype, head_dim, mask,
                                       paths.config_path(), family=forced)
        except dispatch.DispatchError:
            pass  # the forced family cannot run this call: the others may
    return dispatch.candidates(specs(), arch, kind, dtype, head_dim, mask, paths.config_path())
