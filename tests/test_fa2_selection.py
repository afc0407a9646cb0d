"""The FlashAttention-2 conformance run's selection (tests/fa2/conftest.py), checked without a
GPU: what each seed selects, that it covers every test function within the bounds the run
promises, and that the head dims and dtypes asked for are the only ones."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("einops")  # the vendored suite's own dependency

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = 17  # test functions in the vendored test_flash_attn.py


def collect(**environment) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHGEN_FA2_")}
    env.update(environment, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/fa2", "--collect-only", "-q",
                             "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ids = [line for line in result.stdout.splitlines() if "::test_" in line]
    return ids, result.stdout


def by_function(ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for case in ids:
        name = case.split("::")[1].split("[")[0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_a_seed_selects_every_function_within_bounds():
    ids, out = collect(FLASHGEN_FA2_SEED="1")
    counts = by_function(ids)
    assert len(counts) == FUNCTIONS
    assert max(counts.values()) <= 400
    assert len(ids) >= 4000
    assert "FLASHGEN_FA2_SEED=1" in out  # the header names the seed that replays the run


def test_the_same_seed_replays_and_another_draws_anew():
    first, _ = collect(FLASHGEN_FA2_SEED="7")
    again, _ = collect(FLASHGEN_FA2_SEED="7")
    other, _ = collect(FLASHGEN_FA2_SEED="8")
    assert first == again
    assert first != other


def test_an_unseeded_run_prints_the_seed_it_drew():
    _, out = collect()
    assert re.search(r"FLASHGEN_FA2_SEED=\d+", out)


def test_only_the_head_dims_and_dtypes_asked_for_run():
    ids, _ = collect(FLASHGEN_FA2_SEED="3", FLASHGEN_FA2_HEAD_DIMS="32,80,96,160,192,224,256",
                     FLASHGEN_FA2_DTYPES="bf16")
    assert "float16" not in " ".join(i.replace("bfloat16", "") for i in ids)
    output = [i for i in ids if "::test_flash_attn_output[" in i]
    assert output
    for case in output:  # ids begin with the mark nearest the function: softcap, dropout_p,
        d = int(case.split("[")[1].split("-")[4])  # seqlen_q, seqlen_k, d
        assert d in {32, 80, 96, 160, 192, 224, 256}


def test_dropout_runs_only_where_s_dmask_is_not_read():
    ids, _ = collect(FLASHGEN_FA2_SEED="5")
    for case in ids:
        name, params = case.split("::")[1].split("[", 1) if "[" in case else (case, "")
        if name in ("test_flash_attn_qkvpacked", "test_flash_attn_varlen_qkvpacked"):
            assert params.startswith("0.0-"), case  # dropout_p, the mark nearest the function
    race = [i for i in ids if "::test_flash_attn_race_condition[" in i]
    assert any(i.split("[")[1].startswith("0.17-") for i in race)
