"""The benchmark's arithmetic, argument handling and result documents, without a GPU."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from flashgen.cli import main
from flashgen.tools import bench
from flashgen.tools.bench import grid, peak_memory, report, timing


def test_forward_flops_follow_flash_attention_convention():
    assert grid.forward_flops(4, 16, 4096, 4096, 128, False) == 4 * 4 * 16 * 4096**2 * 128
    assert grid.forward_flops(4, 16, 4096, 4096, 128, True) == 2 * 4 * 16 * 4096**2 * 128
    assert grid.forward_flops(1, 1, 3, 5, 8, False) == 4 * 3 * 5 * 8  # seqlen_q != seqlen_k


@pytest.mark.parametrize("seqlen, head_dim, shape", [(4096, 128, (4, 16)), (16384, 64, (1, 32)),
                                                     (512, 256, (32, 8)), (32768, 128, (1, 16))])
def test_grid_keeps_16k_tokens_and_2048_hidden(seqlen, head_dim, shape):
    assert grid.grid_shape(seqlen, head_dim) == shape


def test_input_sets_rotate_only_when_they_fit_in_l2():
    l2 = 50 * 2**20
    assert grid.input_sets(200 * 2**20, l2) == 1
    assert grid.input_sets(30 * 2**20, l2) == 7
    assert grid.input_sets(1, l2) == 8


def fake_cell(mode, seqlen, results):
    batch, heads = grid.grid_shape(seqlen, 128)
    return {"mode": mode, "dtype": "bf16", "head_dim": 128, "causal": True, "seqlen": seqlen,
            "batch": batch, "heads": heads,
            "flops": grid.mode_flops(mode, batch, heads, seqlen, seqlen, 128, True),
            "results": results}


def fake_result():
    """Backward cells first: the Markdown and plots order by mode, not by position."""
    oom = {"error": "CUDA out of memory"}
    cells = [
        fake_cell("bwd", 4096, {"flashgen": {"unsupported": "flashgen: no backward yet"},
                                "FLASH_ATTENTION": {"ms": 2.6, "tflops": 210.0}, "MATH": oom}),
        fake_cell("bwd", 8192, {"flashgen": {"ms": 2.4, "tflops": 231.0},
                                "FLASH_ATTENTION": {"ms": 2.6, "tflops": 210.0}, "MATH": oom}),
        fake_cell("fwd", 4096, {"flashgen": {"ms": 1.0, "tflops": 270.0},
                                "FLASH_ATTENTION": {"ms": 0.9, "tflops": 300.0}, "MATH": oom}),
    ]
    env = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-21T00:00:00+00:00", "torch": "2.11",
           "cuda": "13.0", "cudnn": 91900, "flashgen": "0.1.0", "flashgen_commit": "abc",
           "driver": "580"}
    return {"schema": report.SCHEMA_VERSION, "environment": env, "cells": cells}


def test_backward_flops_are_2_5x_and_forward_backward_3_5x_the_forward():
    full = 4 * 4 * 16 * 4096**2 * 128
    assert grid.mode_flops("fwd", 4, 16, 4096, 4096, 128, False) == full
    assert grid.mode_flops("bwd", 4, 16, 4096, 4096, 128, False) == 2.5 * full
    assert grid.mode_flops("fwd_bwd", 4, 16, 4096, 4096, 128, False) == 3.5 * full
    assert grid.mode_flops("bwd", 4, 16, 4096, 4096, 128, True) == 1.25 * full
    assert fake_result()["cells"][1]["flops"] == 2.5 * 4 * 2 * 16 * 8192**2 * 128 / 2


def test_result_document_round_trips_through_json(tmp_path):
    result = fake_result()
    json_path, md_path = report.write(result, tmp_path)
    assert json.loads(json_path.read_text()) == result
    assert md_path.read_text() == report.markdown(result)


def test_markdown_has_a_section_per_mode_in_mode_order():
    md = report.markdown(fake_result())
    fwd = md.index("## fwd: forward (FLOPs = 1 x forward)")
    bwd = md.index("## bwd: backward (FLOPs = 2.5 x forward)")
    assert fwd < md.index("### fwd bf16 head dim 128 causal") < bwd
    assert bwd < md.index("### bwd bf16 head dim 128 causal")
    assert md.count("| seqlen | batch x heads | flashgen | FLASH_ATTENTION | MATH | ratio |") \
        == 2
    assert fwd < md.index("| 4096 | 4 x 16 | 270.0 | 300.0 | n/a | 0.90 |") < bwd
    assert bwd < md.index("| 4096 | 4 x 16 | unsupported | 210.0 | n/a | n/a |")
    assert bwd < md.index("| 8192 | 2 x 16 | 231.0 | 210.0 | n/a | 1.10 |")
    assert "fwd_bwd" not in md


def test_screen_line_names_mode_and_ratio():
    bwd_4k, bwd_8k, fwd = fake_result()["cells"]
    assert report.format_cell(fwd).startswith("fwd     bf16 hd128 causal seqlen   4096 (4 x 16)")
    assert "flashgen/FLASH_ATTENTION 0.90x" in report.format_cell(fwd)
    assert "flashgen unsupported" in report.format_cell(bwd_4k)
    assert "MATH    n/a" in report.format_cell(bwd_4k)
    assert report.format_cell(bwd_8k).startswith("bwd     ")
    assert report.format_cell(bwd_8k).endswith("flashgen/FLASH_ATTENTION 1.10x")


def test_valid_result_passes_the_schema_check():
    report.check_schema(fake_result())


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r.update(schema=1), "schema version 1, expected 2"),
    (lambda r: r["environment"].pop("gpu"), "environment"),
    (lambda r: r.pop("cells"), "cells must be a list"),
    (lambda r: r["cells"][0].pop("flops"), "cell keys"),
    (lambda r: r["cells"][0].update(mode="backward"), "cell mode 'backward' is not one of"),
    (lambda r: r["cells"][0].update(flops=r["cells"][2]["flops"]),
     r"bwd cell at seqlen 4096 has flops .*2.5 x forward"),
    (lambda r: r["cells"][2].update(mode="bwd"), r"bwd cell at seqlen 4096 has flops"),
    (lambda r: r["cells"][0]["results"].update(flashgen={"ms": 1.0}), "needs ms and tflops"),
    (lambda r: r["cells"][0]["results"]["flashgen"].update(tflops=1.0),
     r"got keys \['tflops', 'unsupported'\]"),
])
def test_malformed_results_are_rejected(breakage, message):
    result = fake_result()
    breakage(result)
    with pytest.raises(ValueError, match=message):
        report.check_schema(result)


def test_plot_from_json_needs_no_gpu_and_draws_a_figure_per_mode(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(fake_result()))
    assert main(["bench", "--plot", str(results)]) == 0
    pngs = [tmp_path / "results-fwd.png", tmp_path / "results-bwd.png"]
    assert all(png.stat().st_size > 1000 for png in pngs)
    assert sorted(tmp_path.glob("*.png")) == sorted(pngs)
    assert capsys.readouterr().out.split() == ["flashgen", "bench:", "wrote", str(pngs[0]),
                                               "flashgen", "bench:", "wrote", str(pngs[1])]


class _NoBackward(torch.autograd.Function):
    """Stands in for an implementation without a backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q + k + v

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("no backward here")


def cpu_time_samples_ms(fn, inputs, warmup=5, repeats=30, reset=None):
    """time_samples_ms without CUDA events: runs the timed call twice, as the timing loop
    would."""
    for _ in range(2):
        if reset:
            reset(*inputs[0])
        fn(*inputs[0])
    return [1.0, 2.0, 5.0]


def cpu_inputs():
    torch.manual_seed(0)
    return [[torch.randn(1, 8, 2, 4) for _ in range(3)]]


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_timed_backward_gives_the_gradient_of_a_random_dout_without_accumulating(mode):
    inputs = cpu_inputs()
    with timing.backend("MATH"):
        fn, sets, reset = timing.timed_call(mode, timing.implementation("MATH", True), inputs)
        q, k, v, out, dout = sets[0]
        assert (out is not None) == (mode == "bwd")  # only bwd keeps the forward's graph
        assert q.data_ptr() == inputs[0][0].data_ptr() and not inputs[0][0].requires_grad
        for _ in range(2):  # twice: a second backward must neither fail nor accumulate
            reset(*sets[0])
            fn(*sets[0])
        expected = torch.autograd.grad(timing.implementation("MATH", True)(q, k, v), (q, k, v),
                                       dout)
    assert dout.abs().min() > 0
    for grad, want in zip((q.grad, k.grad, v.grad), expected):
        torch.testing.assert_close(grad, want)


def test_timed_forward_is_the_plain_call():
    inputs = cpu_inputs()
    fn = timing.implementation("MATH", False)
    assert timing.timed_call("fwd", fn, inputs) == (fn, inputs, None)


def raising(error):
    def fn(q, k, v):
        raise error
    return fn


@pytest.mark.parametrize("impl, mode, expected", [
    (_NoBackward.apply, "fwd", {"ms": 2.0, "tflops": 4.0}),  # the median
    (_NoBackward.apply, "bwd", {"unsupported": "no backward here"}),
    (_NoBackward.apply, "fwd_bwd", {"unsupported": "no backward here"}),
    (raising(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried 8 GiB\ndetails")), "bwd",
     {"error": "CUDA out of memory. Tried 8 GiB"}),
    (raising(RuntimeError("No available kernel. Aborting execution.")), "fwd",
     {"error": "No available kernel. Aborting execution."}),
    (raising(AssertionError("head_dim must be less than or equal to 256")), "fwd",  # FA4's way
     {"unsupported": "flashgen: head_dim must be less than or equal to 256"}),
])
def test_each_implementation_and_mode_is_timed_or_recorded_as_not_run(monkeypatch, impl, mode,
                                                                      expected):
    monkeypatch.setattr(timing, "time_samples_ms", cpu_time_samples_ms)
    monkeypatch.setattr(timing, "implementation", lambda name, causal: impl)
    assert timing.measure("flashgen", mode, False, cpu_inputs(), flops=8e9) == expected


def test_a_cell_times_its_implementations_in_interleaved_rounds_and_pools_their_calls(
        monkeypatch):
    order = []
    clock = iter(range(1, 100))
    rests = []
    monkeypatch.setattr(timing, "rest", lambda seconds: rests.append((len(order), seconds)))

    def calls(name, mode, warmup, repeats):
        assert (warmup, repeats) == (timing.ROUND_WARMUP, timing.ROUND_REPEATS)
        order.append((name, mode))
        if name == "NO_BWD" and mode == "bwd":
            return {"unsupported": "no backward"}
        return [float(next(clock)) for _ in range(2)]

    samples = timing.interleaved_samples(["flashgen", "NO_BWD"], ["fwd", "bwd"], calls, rounds=3)
    a_round = [("flashgen", "fwd"), ("flashgen", "bwd"), ("NO_BWD", "fwd")]
    assert order == [*a_round, ("NO_BWD", "bwd"), *a_round, *a_round]  # not run: not called again
    # Every implementation's calls start after a rest, whatever ran before them.
    assert rests == [(i, timing.ROUND_REST) for i in range(len(order))]
    assert samples == {("flashgen", "fwd"): [1.0, 2.0, 7.0, 8.0, 13.0, 14.0],
                       ("flashgen", "bwd"): [3.0, 4.0, 9.0, 10.0, 15.0, 16.0],
                       ("NO_BWD", "fwd"): [5.0, 6.0, 11.0, 12.0, 17.0, 18.0],
                       ("NO_BWD", "bwd"): {"unsupported": "no backward"}}


MIB = 2**20
MEMORY_ROWS = [  # flashgen: fixed 1 MiB + 12 KiB per token; MATH: quadratic, then out of memory
    {"mode": "fwd_bwd", "seqlen": n, "inputs_bytes": 3 * n * 4096, "flashgen": MIB + 12 * 1024 * n,
     "MATH": 208 * MIB * (n // 1024) ** 2 if n <= 4096 else "OOM", "CUDNN_ATTENTION": "unsupported"}
    for n in (1024, 2048, 4096, 8192)]


def test_memory_rows_are_formatted_per_mode_and_seqlen():
    line = peak_memory.format_memory_row(MEMORY_ROWS[3], ["flashgen", "MATH", "CUDNN_ATTENTION"])
    assert line == ("fwd_bwd seqlen   8192  flashgen     97.0 MiB  MATH          OOM  "
                    "CUDNN_ATTENTION  unsupported")


def test_memory_growth_report_tells_linear_from_quadratic():
    assert peak_memory.growth_report(MEMORY_ROWS, ["flashgen", "MATH", "CUDNN_ATTENTION"]) == [
        "fwd_bwd flashgen: linear, 13.0 KiB per token at seqlen 1024, 12.1 at 8192",
        "fwd_bwd MATH: NOT linear, 208.0 KiB per token at seqlen 1024, 832.0 at 4096",
        "fwd_bwd CUDNN_ATTENTION: ran at 0 seqlen(s), no growth to judge (unsupported)",
    ]


def test_memory_growth_needs_two_seqlens():
    rows = [{"mode": "fwd", "seqlen": 4096, "flashgen": 16 * MIB}]
    assert peak_memory.growth_report(rows, ["flashgen"]) == [
        "fwd     flashgen: ran at 1 seqlen(s), no growth to judge"]


@pytest.mark.parametrize("per_token, linear", [((10, 10, 10), True), ((13, 11, 10), True),
                                               ((10, 11, 12), True), ((10, 12, 13), False)])
def test_linear_growth_allows_allocator_rounding_not_superlinear_growth(per_token, linear):
    points = [(n, b * n) for n, b in zip((1024, 4096, 16384), per_token)]
    assert peak_memory.grows_linearly(points) is linear


@pytest.fixture
def fake_gpu(monkeypatch):
    """The bench's entry points, recording their arguments instead of needing a GPU."""
    calls = {}

    def record(name, returns):
        def fn(**kwargs):
            calls[name] = kwargs
            return returns
        monkeypatch.setattr(bench, name, fn)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    record("run", fake_result())
    record("memory", MEMORY_ROWS)
    return calls


def test_bench_measures_forward_and_backward_by_default(fake_gpu, tmp_path):
    assert main(["bench", "--seqlen", "4096", "--out", str(tmp_path)]) == 0
    assert fake_gpu["run"]["modes"] == ("fwd", "bwd")
    assert fake_gpu["run"]["impls"] == bench.IMPLEMENTATIONS
    assert fake_gpu["run"]["seqlens"] == [4096]
    assert json.loads((tmp_path / "results.json").read_text()) == fake_result()


def test_mode_option_picks_modes(fake_gpu):
    assert main(["bench", "--mode", "fwd_bwd", "--mode", "bwd", "--impl", "MATH"]) == 0
    assert fake_gpu["run"]["modes"] == ("fwd_bwd", "bwd")
    assert fake_gpu["run"]["impls"] == ("MATH",)


def test_unknown_mode_is_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--mode", "backward"])
    assert "invalid choice: 'backward'" in capsys.readouterr().err


def test_memory_measures_forward_and_forward_backward_by_default(fake_gpu, tmp_path):
    assert main(["bench", "--memory", "--out", str(tmp_path)]) == 0
    assert fake_gpu["memory"] == {"seqlens": bench.MEMORY_SEQLENS, "impls": bench.MEMORY_IMPLS,
                                  "modes": ("fwd", "fwd_bwd")}
    assert json.loads((tmp_path / "memory.json").read_text()) == MEMORY_ROWS


def test_memory_takes_mode_impl_and_seqlen(fake_gpu):
    assert main(["bench", "--memory", "--mode", "fwd_bwd", "--impl", "flashgen",
                 "--seqlen", "2048"]) == 0
    assert fake_gpu["memory"] == {"seqlens": (2048,), "impls": ("flashgen",),
                                  "modes": ("fwd_bwd",)}


def test_memory_rejects_the_backward_alone(fake_gpu, capsys):
    assert main(["bench", "--memory", "--mode", "bwd"]) == 2
    assert "--memory measures --mode fwd and fwd_bwd" in capsys.readouterr().err
    assert "memory" not in fake_gpu


def test_unknown_implementation_is_rejected(capsys):
    assert main(["bench", "--impl", "TRITON"]) == 2
    assert "unknown --impl ['TRITON']" in capsys.readouterr().err


def test_version_1_results_still_plot():
    """Runs committed before the backward existed hold forward cells without a mode."""
    from pathlib import Path

    old = json.loads((Path(__file__).parent / "data/results_schema1.json").read_text())
    assert old["schema"] == 1
    result = bench.upgraded(old)
    report.check_schema(result)
    assert {cell["mode"] for cell in result["cells"]} == {"fwd"}
    without_mode = [{k: v for k, v in c.items() if k != "mode"} for c in old["cells"]]
    assert [{k: v for k, v in c.items() if k != "mode"} for c in result["cells"]] == without_mode


def test_results_naming_the_alt_tile_by_its_former_name_are_upgraded():
    result = with_tiles(fake_result())
    forward_results = result["cells"][2]["results"]
    forward_results["flashgen_variant_tile"] = {"ms": 0.8, "tflops": 330.0, "tile": "m64n64w4s2"}
    upgraded = bench.upgraded(result)
    report.check_schema(upgraded)
    renamed = upgraded["cells"][2]["results"]
    assert "flashgen_variant_tile" not in renamed
    assert renamed["flashgen_alt_tile"] == {"ms": 0.8, "tflops": 330.0, "tile": "m64n64w4s2"}
    assert list(renamed) == ["flashgen", "FLASH_ATTENTION", "MATH", "flashgen_main_tile",
                             "flashgen_alt_tile"]
    assert "flashgen_alt_tile" in report.markdown(upgraded)
    assert bench.upgraded(fake_result()) == fake_result()  # nothing to upgrade


def test_deterministic_flashgen_is_an_implementation_on_request(monkeypatch):
    """Timed only when named: flash_attn_func with deterministic=True, outside any SDPA backend."""
    import flashgen

    assert "flashgen_deterministic" not in bench.IMPLEMENTATIONS
    seen = {}
    monkeypatch.setattr(flashgen, "flash_attn_func",
                        lambda q, k, v, causal, deterministic: seen.update(
                            causal=causal, deterministic=deterministic))
    timing.implementation("flashgen_deterministic", causal=True)(None, None, None)
    assert seen == {"causal": True, "deterministic": True}
    timing.implementation("flashgen", causal=False)(None, None, None)
    assert seen == {"causal": False, "deterministic": False}
    assert type(timing.backend("flashgen_deterministic")).__name__ == "nullcontext"


def test_the_e4m3_forward_is_an_implementation_on_request_with_no_backward(monkeypatch):
    """Timed only when named (--impl flashgen_e4m3): flash_attn_func on the inputs the cell cast
    to float8_e4m3fn before timing; its backward is recorded as not run."""
    import flashgen

    assert grid.FP8 not in bench.IMPLEMENTATIONS and grid.FP8 in bench.KNOWN_IMPLEMENTATIONS
    seen = {}
    monkeypatch.setattr(flashgen, "flash_attn_func",
                        lambda q, k, v, causal: seen.update(q=q, causal=causal))
    timing.implementation(grid.FP8, causal=True)("q", None, None)
    assert seen == {"q": "q", "causal": True}
    for mode in ("bwd", "fwd_bwd"):
        assert timing.measure(grid.FP8, mode, False, cpu_inputs(), flops=1e9) == {
            "unsupported": "flashgen's e4m3 forward has no backward"}


def test_batch_and_heads_replace_the_grid_convention():
    assert grid.grid_shape(4096, 128, batch=1) == (1, 16)
    assert grid.grid_shape(4096, 128, heads=8) == (4, 8)
    assert grid.grid_shape(4096, 128, batch=2, heads=4) == (2, 4)


def test_batch_and_heads_options_reach_the_grid(fake_gpu):
    assert main(["bench", "--batch", "1", "--heads", "8", "--impl", "flashgen",
                 "--impl", "flashgen_main_tile"]) == 0
    assert (fake_gpu["run"]["batch"], fake_gpu["run"]["heads"]) == (1, 8)
    assert fake_gpu["run"]["impls"] == ("flashgen", "flashgen_main_tile")


def test_without_batch_and_heads_the_grid_keeps_its_convention(fake_gpu):
    assert main(["bench"]) == 0
    assert (fake_gpu["run"]["batch"], fake_gpu["run"]["heads"]) == (None, None)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch 0: must be at least 1"),
    (["--heads", "-2"], "--heads -2: must be at least 1"),
    (["--batch", "1", "--memory"], "--batch sets the speed grid's shape"),
    (["--heads", "4", "--overhead"], "--heads sets the speed grid's shape"),
])
def test_bad_batch_or_heads_is_rejected_before_looking_for_a_gpu(fake_gpu, capsys, argv,
                                                                  message):
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
    assert "run" not in fake_gpu and "memory" not in fake_gpu


def test_pinned_tile_implementations_are_flashgen_on_one_tile(monkeypatch):
    """Timed only when named: flash_attn_func inside mma.pinned_forward_tile (0: the main tile),
    with the forward's plans cleared on entering and on leaving."""
    from flashgen import forward
    from flashgen.families import mma

    cleared = []
    monkeypatch.setattr(forward, "clear_plans", lambda: cleared.append(mma._pinned_tile))
    assert set(grid.PINNED_TILES) == {"flashgen_main_tile", "flashgen_alt_tile"}
    assert not set(grid.PINNED_TILES) & set(bench.IMPLEMENTATIONS)
    assert set(grid.PINNED_TILES) <= set(bench.KNOWN_IMPLEMENTATIONS)
    assert "flashgen_variant_tile" not in bench.KNOWN_IMPLEMENTATIONS
    with timing.backend("flashgen_main_tile"):
        assert mma._pinned_tile == 0
    assert mma._pinned_tile is None and cleared == [None, None]
    with timing.backend("flashgen_alt_tile"):
        assert mma._pinned_tile == 1
    assert mma._pinned_tile is None and cleared == [None] * 4
    with timing.backend("flashgen"):
        assert mma._pinned_tile is None
    assert cleared == [None] * 4  # flashgen itself picks by shape: its plans stay


@pytest.mark.parametrize("causal, mask", [(True, "causal"), (False, "none")])
def test_forward_tile_names_the_tile_the_implementation_runs(monkeypatch, causal, mask):
    from codegen.families.mma import FwdTile
    from flashgen import forward
    from flashgen.families import mma

    seen = {}

    def kernel_for(device, dtype, head_dim, mask, batch_heads, seqlen_q):
        seen.update(dtype=dtype, head_dim=head_dim, mask=mask, batch_heads=batch_heads,
                    seqlen_q=seqlen_q, pinned=mma._pinned_tile)
        return type("Spec", (), {"tile": FwdTile(64, 64, 4, 2)})

    monkeypatch.setattr(forward, "kernel_for", kernel_for)
    q = torch.empty(2, 512, 8, 128, dtype=torch.bfloat16)
    assert timing.forward_tile("flashgen_main_tile", q, causal=causal) == "m64n64w4s2"
    assert seen == {"dtype": "bf16", "head_dim": 128, "mask": mask, "batch_heads": 16,
                    "seqlen_q": 512, "pinned": 0}
    assert timing.forward_tile("flashgen", q, causal=causal) == "m64n64w4s2"
    assert seen["pinned"] is None


def with_tiles(result):
    """fake_result's forward cell with flashgen's tile and a main-tile-only run beside it."""
    fwd = result["cells"][2]["results"]
    fwd["flashgen"]["tile"] = "m64n64w4s2"
    fwd["flashgen_main_tile"] = {"ms": 1.5, "tflops": 180.0, "tile": "m128n64w4s2"}
    return result


def test_results_name_the_forward_tile_and_what_the_choice_gains():
    result = with_tiles(fake_result())
    report.check_schema(result)
    md = report.markdown(result)
    assert ("| seqlen | batch x heads | flashgen | FLASH_ATTENTION | MATH | flashgen_main_tile "
            "| ratio | vs main tile |") in md
    assert ("| 4096 | 4 x 16 | 270.0 (m64n64w4s2) | 300.0 | n/a | 180.0 (m128n64w4s2) | 0.90 "
            "| 1.50 |") in md
    line = report.format_cell(result["cells"][2])
    assert "flashgen 270.0 (m64n64w4s2)" in line
    assert line.endswith("flashgen/FLASH_ATTENTION 0.90x  flashgen/flashgen_main_tile 1.50x")


@pytest.mark.parametrize("porcelain, expected",
                         [("", "abc123"), (" M flashgen/tools/bench/timing.py\n", "abc123+dirty")])
def test_commit_says_when_the_tree_differs_from_head(monkeypatch, porcelain, expected):
    outputs = {"rev-parse": "abc123\n", "status": porcelain}

    def fake_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 0, stdout=outputs[command[1]], stderr="")

    monkeypatch.setattr(timing.subprocess, "run", fake_run)
    assert timing._git_commit() == expected


# --- host overhead (--overhead) ---------------------------------------------------------------

def test_overhead_sets_the_backward_beside_autograds_floor_which_is_no_peer():
    from flashgen.tools.bench import overhead

    q, k, v = (torch.randn(1, 4, 1, 8, requires_grad=True) for _ in range(3))
    overhead._allocating_backward()(q, k, v).backward(torch.randn(1, 4, 1, 8))
    assert all(t.grad.shape == t.shape for t in (q, k, v))
    medians = {"flashgen": 180.0, "FLASH_ATTENTION": 140.0, overhead.AUTOGRAD_FLOOR: 95.0}
    assert overhead.ratio_to_fastest_peer(medians) == pytest.approx(180.0 / 140.0)


# --- serving (--mode decode / prefill) --------------------------------------------------------

def _serving_row(new, page, ours, fa2=None, cudnn=None, length=32768):
    from flashgen.tools.bench import serving

    cell = next(c for c in serving.cells({**serving.DECODE_GRID, "dtypes": ("bf16",),
                                         "head_dims": (128,), "heads": ((32, 8),),
                                         "batches": (8,), "cache_lengths": (length,),
                                         "new_tokens": (new,), "page_sizes": (page,)}))
    # eager calls: flashgen's twice its graph replay's time, the peers' as their replays'
    row = dict(cell, flashgen={"us": ours, "bandwidth": cell["kv_bytes"] / (ours * 1e-6) / 3e12,
                               "eager_us": 2 * ours})
    if page == 0:
        row.update(FLASH_ATTENTION={"us": fa2, "bandwidth": 0.5, "eager_us": fa2},
                   CUDNN_ATTENTION={"us": cudnn, "bandwidth": 0.9, "eager_us": cudnn})
    return row


def test_serving_grid_skips_caches_over_40_gb():
    from flashgen.tools.bench import serving

    cells = list(serving.cells(serving.DECODE_GRID))
    assert all(c["kv_bytes"] <= serving.MAX_CACHE_BYTES for c in cells)
    assert not any(c["batch"] == 128 and c["cache_length"] == 131072 and c["heads_kv"] == 32
                   for c in cells)
    assert len(cells) == 2 * 472  # per dtype: 472 cells


def test_serving_summary_compares_paged_cells_with_the_contiguous_peers():
    from flashgen.tools.bench import serving

    rows = [_serving_row(1, 0, 100.0, fa2=120.0, cudnn=110.0),
            _serving_row(1, 16, 105.0), _serving_row(1, 1, 130.0),
            _serving_row(4, 0, 101.0, fa2=400.0, cudnn=200.0)]
    s = serving.summary({"rows": rows})
    # flashgen's time against the faster peer of the same (contiguous) cell
    assert s["vs_faster_peer"]["n"] == 4
    assert s["vs_faster_peer"]["min"] == pytest.approx(110.0 / 130.0)
    assert s["vs_faster_peer"]["max"] == pytest.approx(200.0 / 101.0)
    assert s["vs_faster_peer_eager"]["min"] == pytest.approx(110.0 / 260.0)
    assert s["page16_time_vs_dense"]["median"] == pytest.approx(1.05)
    assert s["page1_time_vs_dense"]["median"] == pytest.approx(1.30)
    assert s["new_tokens_time_vs_one"]["median"] == pytest.approx(1.01)
    text = serving.markdown({"mode": "decode", "copy_rate": 3e12, "environment": {},
                             "rows": rows}, "flashgen bench --mode decode")
    assert "`flashgen bench --mode decode`" in text and text.count("| bf16 | 128 |") == 4
    assert "| 100.0 (" in text and "| 200.0 | 120.0 (" in text  # graph (bandwidth), then eager


def test_serving_modes_run_alone():
    assert main(["bench", "--mode", "decode", "--mode", "fwd"]) == 2
    assert main(["bench", "--mode", "prefill", "--impl", "flashgen"]) == 2


def test_variants_cases_narrow_by_name_and_need_the_variants_mode(capsys):
    from flashgen.tools.bench import variants

    assert variants.selected_cases(["dropout", "causal"]) == ("causal", "dropout 0.1")
    assert variants.selected_cases(None) == variants.CASES
    assert main(["bench", "--mode", "variants", "--case", "flash"]) == 2
    assert "no variants case starts with ['flash']" in capsys.readouterr().err
    assert main(["bench", "--mode", "fwd", "--case", "dropout"]) == 2
    assert "--case narrows --mode variants alone" in capsys.readouterr().err


# --- FlashAttention-4 as a peer -----------------------------------------------------------------

@pytest.fixture
def fake_fa4(monkeypatch):
    """flash_attn.cute whose flash_attn_func and flash_attn_varlen_func record their keyword
    arguments (tensors as lists) and return (2 q, None), as FlashAttention-4's return (out,
    lse)."""
    import sys
    import types

    calls = []

    def flash_attn_func(q, k, v, **arguments):
        calls.append({name: value.tolist() if isinstance(value, torch.Tensor) else value
                      for name, value in arguments.items()})
        return 2 * q, None

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = cute.flash_attn_varlen_func = flash_attn_func
    package = types.ModuleType("flash_attn")
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


def test_fa4_is_a_default_implementation_called_through_its_own_flash_attn_func(fake_fa4):
    assert grid.FA4 in bench.IMPLEMENTATIONS
    q = torch.randn(1, 8, 2, 4)
    with timing.backend(grid.FA4):  # no SDPA backend
        out = timing.implementation(grid.FA4, causal=True)(q, q, q)
    assert torch.equal(out, 2 * q) and fake_fa4 == [{"causal": True}]


def test_fa4_where_flash_attn_4_is_not_importable_is_unsupported_and_says_how_to_get_it(
        monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # its import raises ImportError
    result = timing.measure(grid.FA4, "fwd", False, cpu_inputs(), flops=8e9)
    assert "pip install flash-attn-4" in result["unsupported"]


def test_results_with_fa4_get_a_vs_fa4_column_and_screen_ratio():
    result = fake_result()
    for cell in result["cells"]:
        cell["results"][grid.FA4] = {"ms": 1.0, "tflops": 250.0}
    text = report.markdown(result)
    assert "| flashgen | FLASH_ATTENTION | FA4 | MATH | ratio | vs FA4 |" in text
    assert "| 270.0 | 300.0 | 250.0 | n/a | 0.90 | 1.08 |" in text  # fwd: FA2's, then FA4's ratio
    assert "flashgen/FA4 1.08x" in report.format_cell(result["cells"][2])
    assert "| vs FA4 |" not in report.markdown(fake_result())  # no column where FA4 never ran


def test_variants_run_fa4_on_causal_the_window_and_softcap(fake_fa4):
    from flashgen.tools.bench import variants

    q = torch.randn(1, 8, 2, 4)
    for case in variants.FA4_CASES:
        variants._fa4(case)(q, q, q)
    assert fake_fa4 == [{"causal": True}, {"causal": True, "window_size": (variants.WINDOW, 0)},
                        {"causal": True, "softcap": variants.SOFTCAP}]
    assert set(variants.FA4_CASES) <= set(variants.CASES)


def test_fa4_decodes_the_contiguous_cells_through_seqused_k(fake_fa4, monkeypatch):
    import sys

    from flashgen.tools.bench import serving

    cell = dict(dtype="bf16", head_dim=64, heads=8, heads_kv=2, batch=2, cache_length=64,
                new_tokens=1, page_size=0)
    q = torch.randn(2, 1, 8, 64)
    k = torch.randn(2, 64, 2, 64)
    assert torch.equal(serving._fa4(cell, q, k, k, causal=False)(), 2 * q)
    assert fake_fa4 == [{"seqused_k": [64, 64], "causal": False}]
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    with pytest.raises(NotImplementedError, match="pip install flash-attn-4"):
        serving._fa4(cell, q, k, k, causal=False)


def test_serving_summary_and_table_take_fa4_as_a_peer_of_the_contiguous_cells():
    from flashgen.tools.bench import serving

    dense = _serving_row(1, 0, 100.0, fa2=120.0, cudnn=110.0)
    dense[serving.FA4] = {"us": 90.0, "bandwidth": 0.9, "eager_us": 300.0}
    rows = [dense, _serving_row(1, 16, 105.0)]
    s = serving.summary({"rows": rows})
    # the faster peer is FA4 now, for the paged cell too (its contiguous cell's peers)
    assert s["vs_faster_peer"]["max"] == pytest.approx(0.9)
    assert s["vs_faster_peer"]["min"] == pytest.approx(90.0 / 105.0)
    assert s["vs_fa4"]["n"] == 2 and s["vs_fa4_eager"]["max"] == pytest.approx(300.0 / 200.0)
    text = serving.markdown({"mode": "decode", "copy_rate": 3e12, "environment": {},
                             "rows": rows}, "flashgen bench --mode decode")
    assert "| FA4 graph us (bw) | eager | vs faster peer" in text
    assert "| 90.0 (90%) | 300.0 | 0.90 | 0.55 |" in text
    header, rule = (line for line in text.splitlines() if line.startswith("| dtype") or
                    line.startswith("|---"))
    assert header.count("|") == rule.count("|")


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """flashinfer whose BatchDecodeWithPagedKVCacheWrapper records its plan and runs."""
    import sys
    import types

    record = {}

    class Wrapper:
        def __init__(self, workspace, kv_layout, **options):
            record["init"] = (workspace.numel(), kv_layout)
            record["options"] = {name: value.tolist() if isinstance(value, torch.Tensor) else value
                                 for name, value in options.items()}

        def plan(self, indptr, indices, last_page_len, *sizes, **types_):
            record["plan"] = (indptr.tolist(), indices.tolist(), last_page_len.tolist(), sizes,
                              types_)

        def run(self, q, paged):
            record["run"] = (tuple(q.shape), tuple(paged[0].shape), tuple(paged[1].shape))
            return q

    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = Wrapper
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return record


def test_flashinfer_decodes_the_cells_paged_cache_through_the_same_block_table(fake_flashinfer):
    from flashgen.tools.bench import serving

    cell = dict(dtype="bf16", head_dim=64, heads=8, heads_kv=2, batch=2, cache_length=64,
                new_tokens=1, page_size=16)
    q = torch.randn(2, 1, 8, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 64, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    table = torch.tensor([[2, 0, 3, 1], [5, 7, 4, 6]], dtype=torch.int32)
    serving._flashinfer(cell, q, k, v, table)()
    assert fake_flashinfer["init"] == (serving.FLASHINFER_WORKSPACE_BYTES, "NHD")
    indptr, indices, last, sizes, dtypes = fake_flashinfer["plan"]
    assert fake_flashinfer["options"] == {  # its CUDA-graph mode: the plan's own buffers
        "use_cuda_graph": True, "use_tensor_cores": False, "paged_kv_indptr_buffer": indptr,
        "paged_kv_indices_buffer": indices, "paged_kv_last_page_len_buffer": last}
    assert indptr == [0, 4, 8] and indices == [2, 0, 3, 1, 5, 7, 4, 6] and last == [16, 16]
    assert sizes == (8, 2, 64, 16)
    assert dtypes == {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    # one token a sequence, and the cache as pages of 16 rows
    assert fake_flashinfer["run"] == ((2, 8, 64), (8, 16, 2, 64), (8, 16, 2, 64))


def test_flashinfer_where_it_is_not_importable_says_how_to_get_it(monkeypatch):
    import sys

    from flashgen.tools.bench import serving

    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(NotImplementedError, match="pip install flashinfer-python"):
        serving._flashinfer({}, None, None, None, None)


def test_serving_summary_and_table_set_flashgen_beside_flashinfer_on_its_cells():
    from flashgen.tools.bench import serving

    paged = _serving_row(1, 16, 105.0)
    paged[serving.FLASHINFER] = {"us": 126.0, "bandwidth": 0.8, "eager_us": 420.0}
    rows = [_serving_row(1, 0, 100.0, fa2=120.0, cudnn=110.0), paged]
    s = serving.summary({"rows": rows})
    assert s["vs_flashinfer"] == {"min": 1.2, "median": 1.2, "max": 1.2, "n": 1}
    assert s["vs_flashinfer_eager"]["median"] == pytest.approx(2.0)  # 420 / (2 x 105)
    text = serving.markdown({"mode": "decode", "copy_rate": 3e12, "environment": {},
                             "rows": rows}, "flashgen bench --mode decode")
    assert "vs FlashInfer, graph" in text
    assert text.rstrip().endswith("| 126.0 (80%) | 420.0 | 1.20 | 2.00 |")
    assert "FlashInfer" not in serving.markdown(
        {"mode": "decode", "copy_rate": 3e12, "environment": {}, "rows": rows[:1]}, "x")
