"""The flashgen command, without a GPU and without compiling."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from codegen import paths
from codegen.config import load_config
from codegen.spec import enumerate_specs
from flashgen import __version__
from flashgen.cli import main


def test_version():
    result = subprocess.run([sys.executable, "-m", "flashgen", "--version"], capture_output=True,
                            text=True, cwd=paths.REPO_ROOT)
    assert result.returncode == 0 and result.stdout.strip() == f"flashgen {__version__}"


def test_generate_dry_run_renders_the_config(tmp_path, capsys):
    assert main(["generate", "--dry-run", "--out", str(tmp_path)]) == 0
    specs = enumerate_specs(load_config(paths.DEFAULT_CONFIG))  # counted in test_spec_render.py
    assert f"default.toml's {len(specs)} kernel(s)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("mma/*.cu")) == ["bwd_sample.cu", "fwd_sample.cu",
                                                                 "kvcache_sample.cu"]
    assert sorted(p.name for p in tmp_path.glob("hopper/*.cu")) == ["bwd_sample.cu",
                                                                     "fwd_fp8_sample.cu",
                                                                     "fwd_sample.cu"]
    manifest = (tmp_path / "manifest.json").read_text()
    # 3 masks; forward and backward kernels x 5 score modifiers (none, softcap, alibi,
    # softcap_alibi, bias), decode all but bias; then the config's variants at head dims 64 and 128: 7 masks
    # (block_sparse, document, head_window, prefix_lm, and relative_bias under each of the 3) x 2
    # dtypes.
    # 6 head dims (no alt tiles on sm_90, where the hopper family runs the short sequences), x 2
    # dtypes; the built-in ones twice (with dropout), and document's (its table sets dropout =
    # true: head dims 64 and 128, 2 dtypes)
    assert manifest.count('"name": "fwd_mma_sm90_') == 6 * 2 * 3 * 5 * 2 + 7 * 2 * 2 + 4
    assert manifest.count('"name": "bwd_mma_sm90_') == 6 * 2 * 3 * 5 * 2 + 7 * 2 * 2 + 4
    # mma (2 kinds x 2 archs x 6 head dims + sm_80's 2 alt tiles), the hopper forward (5 head dims
    # x 3 masks + 2 causal alt tiles) and backward (5 head dims x 3 masks) x 2 dtypes x 5 score
    # modifiers; document's on both families and archs
    assert manifest.count('_dropout_') == ((2 * 2 * 6 + 2) * 2 * 3 * 5 + (5 * 3 + 2) * 2 * 5
                                           + 5 * 3 * 2 * 5 + 28)
    # head dims 64 and 128 x (main + prefill alt tile) and head dim 256's main tile, x 2 dtypes x 3
    # masks x 4 score modifiers; document's, head_window's and relative_bias's (kvcache = true: 2 +
    # 3 masks) of head dims 64's and 128's tiles
    assert manifest.count('"name": "kvcache_mma_sm90_') == 5 * 2 * 3 * 4 + 4 * 2 * 5
    # 5 head dims x 2 dtypes x 3 masks, and 2 causal short-sequence alt tiles x 2 dtypes;
    # relative_bias's causal kernels take head dim 64's
    assert manifest.count('"name": "fwd_hopper_sm90_') == (5 * 3 + 2) * 2 * 5 * 2 + 7 * 2 * 2 + 2 + 4
    # head dims 64, 96, 128, 192 and 256 x 2 dtypes (the variants' at 64 and 128)
    assert manifest.count('"name": "bwd_hopper_sm90_') == 5 * 2 * 3 * 5 * 2 + 7 * 2 * 2 + 4
    # softcap, alone and with alibi: mma forward, backward, hopper forward, backward (each twice:
    # with dropout), decode
    assert len(re.findall(r'"name": "\w+_sm90_\w+_softcap_', manifest)) == (
        (36 + 36 + 34 + 30) * 2 + 30) * 2


def test_generate_without_arch_asks_for_one(tmp_path, capsys):
    assert main(["generate", "--out", str(tmp_path)]) == 2
    assert "pass --arch" in capsys.readouterr().err


def test_generate_filters_that_match_nothing(tmp_path, capsys):
    assert main(["generate", "--arch", "sm_90", "--head-dim", "72", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no configured kernel matches" in err and "32, 64, 96, 128, 192, 256" in err


@pytest.mark.parametrize("command", ["generate", "list"])
def test_a_filter_that_names_nothing_is_named_with_its_nearest_match(command, tmp_path, capsys):
    assert main([command, "--arch", "sm_90", "--mask", "causl"]) == 2
    err = capsys.readouterr().err
    assert "unknown --mask 'causl'; did you mean 'causal'?" in err and "window" in err
    assert main([command, "--arch", "sm_90", "--score-mod", "softcapp"]) == 2
    assert "unknown --score-mod 'softcapp'; did you mean 'softcap'?" in capsys.readouterr().err


def test_an_arch_without_tables_says_what_to_add(capsys):
    assert main(["generate", "--arch", "sm_86"]) == 2
    err = capsys.readouterr().err
    assert "no kernels for sm_86" in err and "sm_80, sm_90" in err
    assert "[mma.sm_86.head_dim.N]" in err


def test_dry_run_says_how_many_kernels_the_filters_select(tmp_path, capsys):
    assert main(["generate", "--dry-run", "--out", str(tmp_path), "--arch", "sm_90", "--mask",
                 "none", "--mask", "causal", "--score-mod", "none", "--dropout", "without"]) == 0
    assert "the filters select 124" in capsys.readouterr().out  # 112 and 12 e4m3 forwards


def test_list_into_a_pipe_closed_early_exits_quietly():
    result = subprocess.run(f"{sys.executable} -m flashgen list --arch sm_90 | head -1",
                            shell=True, capture_output=True, text=True, cwd=paths.REPO_ROOT)
    assert len(result.stdout.splitlines()) == 1 and result.stderr == ""


def test_help_names_every_command_and_every_kind(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f"`{command}`" in out for command in ("generate", "list", "bench", "tune"))
    with pytest.raises(SystemExit):
        main(["list", "--help"])
    assert "KV-cache kernels (kvcache:" in " ".join(capsys.readouterr().out.split())


def test_the_package_shows_its_functions():
    import flashgen

    for name in flashgen.__all__:
        assert name in dir(flashgen)
        assert name == "__version__" or name in flashgen.__doc__


def test_bad_config_is_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[mma.sm_90.head_dim.84]\nblock_m = 128\nblock_n = 64\nwarps = 4\n"
                   "kv_stages = 2\n")
    assert main(["generate", "--dry-run", "--config", str(bad), "--out", str(tmp_path)]) == 1
    assert "head dim 84 must be a multiple of 8" in capsys.readouterr().err


def test_list_shows_specs_and_build_state(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    assert main(["list", "--arch", "sm_90", "--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "fwd_mma_sm90_bf16_hd128_causal_m128n32w4s3" in out and "not built" in out
    assert "bwd_mma_sm90_bf16_hd128_causal_m64n128w8s2" in out
    assert "fwd_hopper_sm90_bf16_hd128_causal_m128n128s2p1o1" in out
    assert "kvcache_mma_sm90_bf16_hd128_causal_m64n64w4s3" in out
    assert "bwd_hopper_sm90_bf16_hd128_causal_m64n128s3d1" in out
    assert "bwd_hopper_sm90_bf16_hd128_causal_softcap_m64n128s2d1" in out
    # per dtype and mask (6) 4 forward and backward kernels (each family's; no mma alt tile on
    # sm_90) x 5 score modifiers, twice (with dropout), and 2 decode kernels x 4 (all but bias):
    # 288; the variants' 84; the e4m3 forwards, per output dtype and mask (6)
    assert "378 kernel(s)" in out
    assert "fwd_fp8_hopper_sm90_bf16_hd128_causal_m128n128s2p1o1" in out
    assert "fwd_hopper_sm90_bf16_hd128_document_m128n128s2p1o1" in out


def test_list_filters_by_kind_mask_and_family(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    assert main(["list", "--arch", "sm_90", "--head-dim", "128", "--kind", "bwd"]) == 0
    out = capsys.readouterr().out
    assert "fwd_" not in out and "152 kernel(s)" in out
    assert main(["list", "--arch", "sm_90", "--head-dim", "128", "--mask", "none",
                 "--family", "mma"]) == 0
    out = capsys.readouterr().out
    assert "_causal_" not in out and "64 kernel(s)" in out
    assert main(["list", "--arch", "sm_90", "--head-dim", "128", "--kind", "bwd",
                 "--score-mod", "softcap", "--dropout", "without"]) == 0
    out = capsys.readouterr().out
    assert out.count("_softcap_") == 12 and "12 kernel(s)" in out
    assert main(["list", "--arch", "sm_90", "--head-dim", "128", "--kind", "bwd",
                 "--score-mod", "softcap", "--dropout", "with"]) == 0
    out = capsys.readouterr().out
    assert out.count("_softcap_dropout_") == 12 and "12 kernel(s)" in out


def test_preferred_keeps_the_family_each_call_runs_first(tmp_path, monkeypatch, capsys):
    """On sm_90 the hopper family runs the forward and backward of the head dims it configures;
    the mma family the KV cache and the head dims hopper lacks (32)."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    selection = ["list", "--arch", "sm_90", "--mask", "none", "--mask", "causal",
                 "--score-mod", "none", "--dropout", "without"]
    assert main(selection) == 0
    every = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert main([*selection, "--preferred"]) == 0
    kept = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert set(kept) < set(every)
    mma_fwd_bwd = [n for n in kept if re.match(r"(fwd|bwd)_mma_", n)]
    assert mma_fwd_bwd and all("_hd32_" in n for n in mma_fwd_bwd)
    assert ({n for n in every if n.startswith("kvcache_")}
            == {n for n in kept if n.startswith("kvcache_")})
    assert any(n.startswith("fwd_hopper_") and "_hd128_" in n for n in kept)


def test_unknown_arch_is_rejected():
    with pytest.raises(SystemExit):
        main(["generate", "--arch", "sm_99"])


def test_bench_needs_a_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the bench itself runs in scripts/gpu_check.sh")
    assert main(["bench"]) == 1
    assert "no CUDA GPU" in capsys.readouterr().err


def test_generate_warns_of_a_kernel_whose_wgmma_ptxas_serialised(tmp_path, capsys, monkeypatch):
    from codegen import build
    from flashgen.cache import Entry

    def fake_build(specs, jobs=None):
        entries = [Entry(spec, tmp_path / spec.name) for spec in specs]
        for entry in entries:
            entry.path.mkdir()
            serialised = "causal" in entry.spec.name
            (entry.path / "meta.json").write_text(
                f'{{"resources": {{"wgmma_serialised": {str(serialised).lower()}}}}}')
        return entries

    monkeypatch.setattr(build, "build", fake_build)
    monkeypatch.setattr(build, "build_binding", lambda: tmp_path / "binding.so")
    assert main(["generate", "--arch", "sm_90", "--family", "hopper", "--kind", "bwd",
                 "--head-dim", "128", "--dtype", "bf16", "--score-mod", "none", "--dropout",
                 "without", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning: bwd_hopper_sm90_bf16_hd128_causal_m64n128s3d1: ptxas serialised" in err
    assert "_none_" not in err


def test_doctor_says_what_a_call_needs_and_how_to_get_it(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the doctor finds it (scripts/gpu_check.sh runs it)")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "MISSING  GPU: no CUDA GPU is visible to torch" in out
    for name in ("torch", "nvcc", "CUTLASS", "config", "JIT", "transformers"):
        assert re.search(rf"^  (ok|MISSING|absent) +{name}: ", out, re.MULTILINE), name
    assert out.rstrip().endswith("1 thing(s) a call needs are missing: GPU")


def test_doctor_without_nvcc_calls_it_optional(monkeypatch, capsys):
    pytest.importorskip("torch")
    from flashgen import cache
    from flashgen.tools import doctor

    monkeypatch.setattr(cache, "nvcc_version", lambda: None)
    nvcc = next(c for c in doctor.checks() if c.name == "nvcc")
    assert not nvcc.ok and not nvcc.needed and "install the CUDA toolkit" in nvcc.fix
