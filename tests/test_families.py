"""The seams for more kernel families and masks: a toy family is a config table, a record and a
template, and dispatch ranks it without a change; a mask is a policy type that one template
renders for every mask kind."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from codegen import build, families, masks, paths, render
from codegen.config import parse_config
from codegen.family import Family, Kind, Tile
from codegen.spec import enumerate_specs
from flashgen import dispatch

TOY_TEMPLATES = Path(__file__).parent / "toy_family"


@dataclass(frozen=True, order=True)
class ToyTile(Tile):
    SUFFIX = ("t",)
    threads: int


def toy_problems(head_dim: int, tile: ToyTile, arch) -> list[str]:
    return [] if tile.threads % 32 == 0 else [f"threads = {tile.threads} must be a multiple of 32"]


TOY = Family(name="toy", archs=("sm_80", "sm_90"), priority=10,
             kinds=(Kind("fwd", table=None, tile=ToyTile, template="fwd_kernel.cu.j2",
                         problems=toy_problems),),
             template_dir=TOY_TEMPLATES)

CONFIG = {"masks": ["none", "causal"], "dtypes": ["bf16"],
          "toy": {"sm_90": {"head_dim": {"64": {"threads": 128}}}},
          "mma": {"sm_90": {"head_dim": {"64": {"block_m": 128, "block_n": 64, "warps": 4,
                                                "kv_stages": 2}}}}}


@pytest.fixture
def toy_family():
    families.register(TOY)
    yield TOY
    families.unregister(TOY.name)


def test_a_family_is_a_config_table(toy_family):
    config = parse_config(CONFIG, Path("toy.toml"))
    assert config.families == ["mma", "toy"]
    names = [s.name for s in enumerate_specs(config, family_names=["toy"])]
    assert names == ["fwd_toy_sm90_bf16_hd64_causal_t128", "fwd_toy_sm90_bf16_hd64_none_t128"]


def test_a_family_checks_its_own_keys_and_resources(toy_family):
    from codegen.config import ConfigError

    bad = {"toy": {"sm_90": {"head_dim": {"64": {"threads": 100}}}}}
    with pytest.raises(ConfigError, match="head_dim.64: threads = 100 must be a multiple"):
        parse_config(bad, Path("toy.toml"))
    with pytest.raises(ConfigError, match=r"toy: unknown key\(s\) \['sm_89'\]"):
        parse_config({"toy": {"sm_89": {"head_dim": {}}}}, Path("toy.toml"))


def test_dispatch_ranks_a_new_family_by_its_priority(toy_family):
    config = parse_config(CONFIG, Path("toy.toml"))
    specs = tuple(enumerate_specs(config))
    choices = dispatch.candidates(specs, "sm_90", "fwd", "bf16", 64, "causal")
    assert [c.spec.family for c in choices] == ["toy", "mma"]
    only_mma = dispatch.candidates(specs, "sm_90", "fwd", "bf16", 64, "causal", family="mma")
    assert [c.spec.family for c in only_mma] == ["mma"]


def test_the_toy_template_renders_the_spec_and_its_mask(toy_family):
    config = parse_config(CONFIG, Path("toy.toml"))
    for spec in enumerate_specs(config, family_names=["toy"]):
        text = render.render_spec(spec)
        assert f'extern "C" int {spec.name}(' in text
        assert f"using Mask = {masks.MASKS[spec.mask].cpp_type};" in text
        assert "constexpr int kThreads = 128;" in text


@pytest.mark.nvcc
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed")
def test_the_toy_family_compiles(toy_family, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    config = parse_config(CONFIG, Path("toy.toml"))
    (spec,) = enumerate_specs(config, family_names=["toy"], masks=["causal"])
    build.build([spec], objects_only=True)
    (obj,) = (tmp_path / "sm_90" / ".build" / "obj").glob(f"{spec.name}-*.o")
    assert obj.stat().st_size > 1000


@pytest.fixture
def dummy_mask():
    """A third mask kind: any C++ policy type with mask.cuh's members."""
    masks.MASKS["dummy"] = masks.MaskKind("dummy", "flashgen::test::EveryOtherKey",
                                          hides_keys=True)
    yield masks.MASKS["dummy"]
    del masks.MASKS["dummy"]


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_one_template_renders_every_mask_policy(dummy_mask, kind):
    config = parse_config({"masks": ["none", "causal", "dummy"],
                           "mma": CONFIG["mma"] | {"sm_90": {"head_dim": {"64": {
                               **CONFIG["mma"]["sm_90"]["head_dim"]["64"],
                               "backward": {"block_m": 64, "block_n": 128, "warps": 8,
                                            "q_stages": 2}}}}}}, Path("masks.toml"))
    specs = enumerate_specs(config, kinds=[kind], dtypes=["bf16"], alt_tiles=False,
                            dropout=False)
    rendered = {s.mask: render.render_spec(s) for s in specs}
    assert sorted(rendered) == ["causal", "dummy", "none"]
    for mask, text in rendered.items():
        launch = (f"launch_{kind}<Traits, {masks.MASKS[mask].cpp_type}, flashgen::IdentityScore, "
                  f"flashgen::NoDropout>")
        assert launch in text
        others = {m.cpp_type for name, m in masks.MASKS.items() if name != mask}
        assert not any(f"<Traits, {other}>" in text for other in others)
    # everything but the mask is the same kernel
    strip = {m: t.replace(masks.MASKS[m].cpp_type, "MASK").replace(f"_{m}_", "_") .replace(
        f"mask={m}", "mask=") for m, t in rendered.items()}
    assert strip["none"] == strip["causal"] == strip["dummy"]


def test_unknown_masks_are_rejected():
    from codegen.config import ConfigError

    with pytest.raises(ConfigError, match="masks"):
        parse_config({"masks": ["dummy"], "mma": CONFIG["mma"]}, Path("masks.toml"))
