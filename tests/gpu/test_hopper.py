"""The hopper family on the GPU: dispatch runs it on compute capability 9.0, every built kernel
runs wgmma, tiles without keys come out right among tiles with keys, and blocks that walk many
tiles on a persistent grid (statically without a mask, claimed from a counter under a causal one)
get every tile right, on every call. The rest of the forward
suite runs on it too (it is the default there); scripts/gpu_check.sh runs the forward files again
with FLASHGEN_FAMILY=mma."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from flashgen import cache, flash_attn_func, forward, registry
from flashgen.reference import assert_close_fa2, attention_ref

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

hopper_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the hopper family runs on compute capability 9.0")


@hopper_gpu
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_dispatch_runs_the_hopper_forward_on_compute_capability_9_0(mask):
    spec = forward.kernel_for(torch.device("cuda", 0), "bf16", 128, mask, 16, 4096)
    forced = os.environ.get("FLASHGEN_FAMILY")
    assert spec.family == (forced or "hopper")


@hopper_gpu
def test_every_built_hopper_kernel_runs_wgmma():
    """ptxas turns wgmma into HGMMA; a kernel whose SASS lacks it fell back to something else."""
    cuobjdump = shutil.which("cuobjdump") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("cuobjdump (CUDA toolkit) is not installed")
    entries = [e for s in registry.specs() if s.family == "hopper"
               if (e := cache.find_entry(s)) is not None]
    assert entries, "no hopper kernel is built: run `flashgen generate --arch sm_90` first"
    for entry in entries:
        sass = subprocess.run([cuobjdump, "-sass", str(entry.lib)], capture_output=True,
                              text=True, check=True).stdout
        assert "HGMMA" in sass, f"{entry.spec.name}: no HGMMA in its SASS"


@hopper_gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tiles_without_keys_between_tiles_with_keys(head_dim):
    """Bottom-right causal with seqlen_q > seqlen_k: the first 500 rows see no key, so the grid
    (more tiles than SMs) mixes tiles that skip every load with tiles that load."""
    q = torch.randn(4, 700, 16, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 200, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, causal=True)
    out_pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert torch.equal(out[:, :500], torch.zeros_like(out[:, :500]))
    assert torch.isneginf(lse[:, :, :500]).all()
    torch.testing.assert_close(lse[:, :, 500:], lse_ref[:, :, 500:], atol=1e-3, rtol=1e-4)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_blocks_walking_many_tiles(head_dim, dtype, causal):
    """Several times more tiles than SMs: where the tile has an output buffer of its own, each
    block walks many tiles, loading the next Q under the last output (dealt out statically
    without a mask, claimed in order from a counter under a causal one); odd lengths and GQA make
    every walk cross sequences, heads and a ragged last query block."""
    q = torch.randn(5, 777, 16, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(5, 1001, 4, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, causal)
    out_pt, lse_pt = attention_ref(q, k, v, causal, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")


@hopper_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_causal_calls_claim_every_tile_on_every_call_and_replay(head_dim):
    """The tile counter starts from zero on every call, in a captured CUDA graph's replays too: a
    call or replay that found it where the last one left it would skip tiles, and their rows
    would keep the poisoned output's NaN."""
    q, k, v = (torch.randn(8, 1024, 16, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    expected = attention_ref(q, k, v, True)[0]
    expected_pt = attention_ref(q, k, v, True, upcast=False)[0]
    for call in range(3):
        assert_close_fa2(flash_attn_func(q, k, v, causal=True), expected, expected_pt,
                         f"out of call {call}")

    side = torch.cuda.Stream()  # load the kernel and fill the allocator's pools off the graph
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attn_func(q, k, v, causal=True)
    for replay in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        assert_close_fa2(captured, expected, expected_pt, f"out of replay {replay}")
