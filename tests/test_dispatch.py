"""Dispatch as a pure function of the configured specs and the call."""

from __future__ import annotations

import pytest

from codegen import paths
from codegen.config import load_config
from codegen.spec import enumerate_specs
from flashgen.dispatch import DispatchError, select

CONFIG = load_config(paths.DEFAULT_CONFIG)
SPECS = tuple(enumerate_specs(CONFIG, variants=False))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_configured_head_dims_run_exactly(arch, head_dim, dtype, causal):
    choice = select(SPECS, arch, dtype, head_dim, causal)
    spec = choice.spec
    assert (spec.arch, spec.dtype, spec.head_dim, spec.causal) == (arch, dtype, head_dim, causal)
    assert spec.tile == CONFIG.forward_tiles(arch, head_dim)[0]  # the main tile, not a variant
    assert not choice.pad_head_dim


@pytest.mark.parametrize("head_dim, runs_on", [(8, 32), (40, 64), (72, 96), (80, 96),
                                               (136, 192), (200, 256), (36, 64)])
def test_unconfigured_head_dim_runs_zero_padded_on_the_next_larger(head_dim, runs_on):
    choice = select(SPECS, "sm_90", "bf16", head_dim, False)
    assert choice.spec.head_dim == runs_on and choice.pad_head_dim


def test_head_dim_above_the_largest_lists_the_configured_ones():
    with pytest.raises(DispatchError, match=r"configured head dims: \[32, 64, 96, 128, 192, 256\]"):
        select(SPECS, "sm_90", "bf16", 264, False)


def test_head_dim_beyond_a_smaller_config_shows_the_table_to_add(tmp_path):
    specs = tuple(s for s in SPECS if s.head_dim <= 128)
    with pytest.raises(DispatchError, match=r"\[arch.sm_90.head_dim.192\]"):
        select(specs, "sm_90", "bf16", 192, False, "my.toml")


def test_unknown_arch_says_how_to_add_it():
    with pytest.raises(DispatchError, match=r"sm_86.*configures sm_80, sm_90.*\[arch.sm_86"):
        select(SPECS, "sm_86", "fp16", 64, False)


def test_dtype_not_built():
    specs = tuple(s for s in SPECS if s.dtype == "bf16")
    with pytest.raises(DispatchError, match="no fp16 non-causal forward kernels"):
        select(specs, "sm_90", "fp16", 64, False)
