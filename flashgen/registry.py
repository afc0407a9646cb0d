"""The kernels the active config declares ($FLASHGEN_CONFIG or the default), and dispatch over
them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from codegen import families, paths
from codegen.config import Config, load_config
from codegen.family import Family
from codegen.spec import KernelSpec, configured_specs
from flashgen import dispatch


@functools.cache
def _load(path: Path) -> tuple[Config, tuple[KernelSpec, ...]]:
    config = load_config(path)
    return config, tuple(configured_specs(config))


def active_config() -> Config:
    return _load(paths.config_path())[0]


def specs() -> tuple[KernelSpec, ...]:
    """Every configured spec; each (family, kind, arch, dtype, head dim, mask, score modifier)'s
    tiles in the config's order, the main tile first."""
    return _load(paths.config_path())[1]


def candidates(arch: str, kind: str, dtype: str, head_dim: int, mask: str,
               score_mod: str = "none",
               accepts: Callable[[Family], bool] = lambda family: True,
               dropout: bool = False) -> tuple[dispatch.Choice, ...]:
    """dispatch.candidates over the active config (its errors name the config) of the families
    that `accepts` (e.g. those that take a variable-length batch), restricted to
    $FLASHGEN_FAMILY when set and that family can run the call (FLASHGEN_FAMILY=hopper forces
    the forward; gradients of a head dim without a hopper backward, or of a variable-length
    batch, still run on a family that has one). Empty when no accepted family can."""
    forced = paths.forced_family()
    if forced is not None and forced not in families.FAMILIES:
        raise dispatch.DispatchError(
            f"flashgen: FLASHGEN_FAMILY={forced} names no kernel family; known: "
            f"{', '.join(sorted(families.FAMILIES))}")
    if forced is not None and accepts(families.FAMILIES[forced]):
        try:
            return dispatch.candidates(specs(), arch, kind, dtype, head_dim, mask,
                                       paths.config_path(), family=forced, score_mod=score_mod,
                                       dropout=dropout)
        except dispatch.DispatchError:
            pass  # the forced family cannot run this call: the others may
    choices = dispatch.candidates(specs(), arch, kind, dtype, head_dim, mask,
                                  paths.config_path(), score_mod=score_mod, dropout=dropout)
    return tuple(c for c in choices if accepts(c.spec.family_record))
