"""The benchmark's arithmetic, argument handling and result documents, without a GPU."""

from __future__ import annotations

import json

import pytest

from flashgen import bench
from flashgen.cli import main


def test_forward_flops_follow_flash_attention_convention():
    assert bench.forward_flops(4, 16, 4096, 4096, 128, False) == 4 * 4 * 16 * 4096**2 * 128
    assert bench.forward_flops(4, 16, 4096, 4096, 128, True) == 2 * 4 * 16 * 4096**2 * 128
    assert bench.forward_flops(1, 1, 3, 5, 8, False) == 4 * 3 * 5 * 8  # seqlen_q != seqlen_k


@pytest.mark.parametrize("seqlen, head_dim, shape", [(4096, 128, (4, 16)), (16384, 64, (1, 32)),
                                                     (512, 256, (32, 8)), (32768, 128, (1, 16))])
def test_grid_keeps_16k_tokens_and_2048_hidden(seqlen, head_dim, shape):
    assert bench.grid_shape(seqlen, head_dim) == shape


def test_input_sets_rotate_only_when_they_fit_in_l2():
    l2 = 50 * 2**20
    assert bench.input_sets(200 * 2**20, l2) == 1
    assert bench.input_sets(30 * 2**20, l2) == 7
    assert bench.input_sets(1, l2) == 8


def fake_result():
    cell = {"mode": "fwd", "dtype": "bf16", "head_dim": 128, "causal": True, "seqlen": 4096,
            "batch": 4, "heads": 16, "flops": 2.7e11,
            "results": {"flashgen": {"ms": 1.0, "tflops": 270.0},
                        "FLASH_ATTENTION": {"ms": 0.9, "tflops": 300.0},
                        "MATH": {"error": "CUDA out of memory"}}}
    env = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-21T00:00:00+00:00", "torch": "2.11",
           "cuda": "13.0", "cudnn": 91900, "flashgen": "0.1.0", "flashgen_commit": "abc",
           "driver": "580"}
    return {"schema": bench.SCHEMA_VERSION, "environment": env, "cells": [cell]}


def test_result_document_round_trips_through_json_and_markdown(tmp_path):
    result = fake_result()
    json_path, md_path = bench.write(result, tmp_path)
    assert json.loads(json_path.read_text()) == result
    md = md_path.read_text()
    assert "| seqlen | flashgen | FLASH_ATTENTION | MATH | ratio |" in md
    assert "| 4096 | 270.0 | 300.0 | n/a | 0.90 |" in md
    assert bench.ratio(result["cells"][0]) == pytest.approx(0.9)


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r.update(schema=0), "schema version"),
    (lambda r: r["environment"].pop("gpu"), "environment"),
    (lambda r: r["cells"][0].pop("flops"), "cell keys"),
    (lambda r: r["cells"][0]["results"].update(flashgen={"ms": 1.0}), "needs ms and tflops"),
])
def test_malformed_results_are_rejected(breakage, message):
    result = fake_result()
    breakage(result)
    with pytest.raises(ValueError, match=message):
        bench.check_schema(result)


def test_plot_from_json_needs_no_gpu(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(fake_result()))
    assert main(["bench", "--plot", str(results)]) == 0
    assert (tmp_path / "results.png").stat().st_size > 1000


def test_unknown_implementation_is_rejected(capsys):
    assert main(["bench", "--impl", "TRITON"]) == 2
    assert "unknown --impl ['TRITON']" in capsys.readouterr().err
