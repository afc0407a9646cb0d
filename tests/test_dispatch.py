"""Dispatch as a pure function of the configured specs and the call: candidates by family
priority, then tile."""

from __future__ import annotations

import pytest

from codegen import families, paths
from codegen.family import Family
from flashgen import registry
from flashgen.dispatch import DispatchError, candidates

SPECS = registry._load(paths.DEFAULT_CONFIG)[1]
CONFIG = registry._load(paths.DEFAULT_CONFIG)[0]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_configured_head_dims_run_exactly_main_tile_first(arch, head_dim, dtype, mask, kind):
    """The hopper family runs the sm_90 forward of the head dims it configures (all but 32) and
    the backward of head dims 64, 96, 128, 192 and 256, the mma family the rest; each family's
    kernels of the head dim come together, main tile first."""
    choices = candidates(SPECS, arch, kind, dtype, head_dim, mask)
    hopper = arch == "sm_90" and head_dim in ((64, 96, 128, 192, 256) if kind == "fwd"
                                              else (64, 96, 128, 192, 256))
    order = ["hopper", "mma"] if hopper else ["mma"]
    exact = [c for c in choices if not c.pad_head_dim]
    assert list(choices[:len(exact)]) == exact  # a family that would pad comes after
    assert [c.spec.tile for c in exact] == [
        t for family in order for t in CONFIG.tiles_of(family, kind, arch, head_dim, mask, "none")]
    for choice in exact:
        spec = choice.spec
        assert (spec.kind, spec.arch, spec.dtype, spec.head_dim, spec.mask) == (
            kind, arch, dtype, head_dim, mask)
        assert not choice.pad_head_dim and choice.padded_head_dim is None
    assert choices[0].spec.family == order[0]


@pytest.mark.parametrize("head_dim, runs_on", [(8, 32), (40, 64), (72, 96), (80, 96),
                                               (136, 192), (200, 256), (36, 64)])
def test_unconfigured_head_dim_runs_zero_padded_on_the_next_larger(head_dim, runs_on):
    (first, *_) = candidates(SPECS, "sm_90", "fwd", "bf16", head_dim, "none")
    assert first.spec.head_dim == runs_on == first.padded_head_dim and first.pad_head_dim


def test_head_dim_above_the_largest_lists_the_configured_ones():
    with pytest.raises(DispatchError, match=r"configured head dims: \[32, 64, 96, 128, 192, 256\]"):
        candidates(SPECS, "sm_90", "fwd", "bf16", 264, "none")


# The example is a configured tile that builds at the new head dim (the mma forward's 64 x 64),
# else the most general family's.
@pytest.mark.parametrize("kind, table", [("fwd", r"\[mma.sm_80.head_dim.192\]\nblock_m = 64"),
                                         ("bwd", r"\[mma.sm_80.head_dim.192.backward\]\n")])
def test_head_dim_beyond_a_smaller_config_shows_the_table_to_add(kind, table):
    specs = tuple(s for s in SPECS if s.head_dim <= 128)
    with pytest.raises(DispatchError, match=table):
        candidates(specs, "sm_80", kind, "bf16", 192, "none", "my.toml")


def test_unknown_arch_says_how_to_add_it():
    with pytest.raises(DispatchError, match=r"sm_86.*configures sm_80, sm_90.*\[mma.sm_86"):
        candidates(SPECS, "sm_86", "fwd", "fp16", 64, "none")


def test_dtype_not_built():
    specs = tuple(s for s in SPECS if s.dtype == "bf16")
    with pytest.raises(DispatchError, match="no fp16 forward kernels with mask 'none'"):
        candidates(specs, "sm_90", "fwd", "fp16", 64, "none")


MMA_SPECS = tuple(s for s in SPECS if s.family == "mma")


def _with_family(name: str, priority: int, head_dims=(64, 128)):
    """The mma family's specs plus a copy of its sm_80 forward specs (a main and an alt tile at
    head dims 64 and 128) of head_dims under another family."""
    from dataclasses import replace

    families.register(Family(name=name, archs=("sm_80",), priority=priority,
                             kinds=families.FAMILIES["mma"].kinds,
                             template_dir=families.FAMILIES["mma"].template_dir))
    extra = tuple(replace(s, family=name) for s in MMA_SPECS
                  if s.arch == "sm_80" and s.kind == "fwd" and s.head_dim in head_dims)
    return MMA_SPECS + extra


@pytest.fixture
def second_family():
    yield _with_family
    families.unregister("second")


@pytest.mark.parametrize("priority, first", [(10, "second"), (1000, "mma")])
def test_candidates_come_by_family_priority_then_tile(second_family, priority, first):
    specs = second_family("second", priority)
    choices = candidates(specs, "sm_80", "fwd", "bf16", 128, "causal")
    order = [c.spec.family for c in choices]
    assert order[0] == first and order == sorted(order, key=lambda f: f != first)
    assert len(choices) == 4  # each family's main tile and its alt tile


def test_a_family_runs_padded_where_it_lacks_the_head_dim(second_family):
    """Padding is work: a family with the call's own head dim goes first, whatever the
    priorities; one that pads comes after it."""
    specs = second_family("second", 10, head_dims=(128,))
    choices = candidates(specs, "sm_80", "fwd", "bf16", 64, "none")
    assert [(c.spec.family, c.spec.head_dim, c.pad_head_dim) for c in choices] == [
        ("mma", 64, False), ("mma", 64, False), ("second", 128, True), ("second", 128, True)]
    choices = candidates(specs, "sm_80", "fwd", "bf16", 100, "none")
    assert [c.spec.family for c in choices] == ["second", "second", "mma", "mma"]


def test_forcing_a_family_keeps_only_its_kernels(second_family):
    specs = second_family("second", 10)
    choices = candidates(specs, "sm_80", "fwd", "bf16", 64, "none", family="mma")
    assert {c.spec.family for c in choices} == {"mma"}
    with pytest.raises(DispatchError, match="no second forward kernels for this GPU's arch sm_90"):
        candidates(specs, "sm_90", "fwd", "bf16", 64, "none", family="second")
