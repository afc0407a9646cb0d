"""A user adds a config-defined variant at head dims 96 and 256 (the default config builds its
examples at 64 and 128), runs `flashgen generate`, and the variant's forward and gradients match
the fp32 reference on every family: a document mask and a relative-position bias in one table,
GQA, odd lengths. Its mask_mod is written with && (the shipped snippets use &, which runs
branch-free), so the short-circuit form stays tested too. At these head dims the hopper family
runs the forward and the backward (at 96 the consumer warpgroups' dQ shares 64 and 32 columns,
at 256 the two splitting the head dim)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from codegen import paths

pytestmark = pytest.mark.gpu

VARIANT = """
[variants.document_bias]
tensors = { doc_ids = "int32[batch, seqlen_k]", bias = "float32[heads, distances]" }
mask_mod = "kv_idx <= q_idx && doc_ids(b, q_idx) == doc_ids(b, kv_idx)"
score_mod = "score + bias(h, kv_idx - q_idx + (bias.size(1) - 1) / 2)"
score_mod_grad = "1"
head_dims = [96, 256]
"""

CHECK = textwrap.dedent("""
    import torch
    from tests.gpu.test_backward import assert_attention_matches_reference, make_qkv
    from tests.gpu.test_variants import document_ids, document_visible, relative_bias_scores
    torch.manual_seed(0)
    batch, seqlen, heads, heads_kv = 2, 333, 8, 2
    for head_dim in (96, 256):
        q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, torch.bfloat16,
                           False)
        doc_ids = document_ids(batch, seqlen)
        bias = torch.randn(heads, 2 * seqlen - 1, device="cuda")
        reference = dict(causal=False, visible=document_visible(doc_ids),
                         score_bias=relative_bias_scores(bias, seqlen))
        assert_attention_matches_reference(
            q, k, v, reference, variant="document_bias",
            variant_tensors={"doc_ids": doc_ids, "bias": bias})
        print("head dim", head_dim, "ok")
""")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The default config plus the variant, its kernels built for this GPU (bf16)."""
    major, minor = torch.cuda.get_device_capability()
    tmp = tmp_path_factory.mktemp("variant_head_dims")
    path = tmp / "with_document_bias.toml"
    path.write_text(paths.DEFAULT_CONFIG.read_text() + VARIANT)
    subprocess.run([sys.executable, "-m", "flashgen", "generate", "--config", str(path),
                    "--arch", f"sm_{major}{minor}", "--mask", "document_bias", "--dtype", "bf16",
                    "--out", str(tmp / "generated")], check=True,
                   env=dict(os.environ, FLASHGEN_CONFIG=str(path)))
    return path


@pytest.mark.parametrize("family", ["hopper", "mma"])
def test_a_variant_added_at_head_dims_96_and_256_matches_the_reference(config, family):
    if family == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the hopper family runs on sm_90")
    # JIT off: every kernel must come from what `generate` built.
    env = dict(os.environ, FLASHGEN_CONFIG=str(config), FLASHGEN_FAMILY=family, FLASHGEN_JIT="0")
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=paths.REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "head dim 96 ok" in result.stdout and "head dim 256 ok" in result.stdout
