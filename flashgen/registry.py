"""The kernels the active config declares ($FLASHGEN_CONFIG or the default), per arch."""

from __future__ import annotations

import functools
from pathlib import Path

from codegen import paths
from codegen.config import Config, load_config
from codegen.spec import KernelSpec, enumerate_specs
from flashgen import dispatch


@functools.cache
def _load(path: Path) -> tuple[Config, tuple[KernelSpec, ...]]:
    config = load_config(path)
    return config, tuple(enumerate_specs(config, variants=False))


def active_config() -> Config:
    return _load(paths.config_path())[0]


def main_specs() -> tuple[KernelSpec, ...]:
    """The main tiles' specs, one per (direction, arch, dtype, head dim, causal): what
    dispatch.select chooses among (spec.forward_candidates adds a forward spec's variants)."""
    return _load(paths.config_path())[1]


def main_choice(arch: str, dtype: str, head_dim: int, causal: bool,
                direction: str) -> dispatch.Choice:
    """dispatch.select among the active config's main tiles (its errors name the config)."""
    return dispatch.select(main_specs(), arch, dtype, head_dim, causal, paths.config_path(),
                           direction)
