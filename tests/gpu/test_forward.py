"""flash_attn_func and the SDPA drop-in against the fp32 reference, over the default config's
specialisation matrix. Outputs are poisoned (NaN) before each call to catch unwritten elements
(tests/gpu/conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.cases import matrix_cases, sdpa_cases

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed):
    device = "cuda"
    if packed and seqlen_q == seqlen_k:
        qkv = torch.randn(batch, seqlen_q, heads + 2 * heads_kv, head_dim, device=device,
                          dtype=dtype)
        return qkv.split([heads, heads_kv, heads_kv], dim=2)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype)
    return q, k, v


@matrix_cases
def test_flash_attn_func(dtype, head_dim, causal, shape):
    from flashgen import flash_attn_func

    batch, seqlen_q, seqlen_k, heads, heads_kv, packed = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed)
    if packed and seqlen_q == seqlen_k:
        assert not q.is_contiguous()
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert probs is None
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_pt, lse_pt = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")


@sdpa_cases
def test_sdpa_drop_in(dtype, head_dim, is_causal, shape):
    from flashgen import scaled_dot_product_attention

    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    query = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", dtype=dtype)
    key = torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=dtype)
    value = torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=dtype)
    gqa = heads != heads_kv
    out = scaled_dot_product_attention(query, key, value, is_causal=is_causal, enable_gqa=gqa)
    assert out.shape == query.shape
    # PyTorch's SDPA in fp32 is the reference, PyTorch's SDPA in the input dtype its own error.
    ref = F.scaled_dot_product_attention(query.float(), key.float(), value.float(),
                                         is_causal=is_causal, enable_gqa=gqa)
    same_dtype = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal,
                                                enable_gqa=gqa)
    assert_close_fa2(out, ref, same_dtype, "out")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_forward_repeated_at_one_shape_runs_its_kept_launch_on_each_calls_tensors(head_dim,
                                                                                    causal):
    """The second and later calls of a shape are known calls (flashgen/attention.py): no checks,
    the first's kept params (flashgen/forward.py) launched with their own tensors; fresh inputs
    each call, each output its own, eager and in a CUDA graph's capture."""
    from flashgen import attention, flash_attn_func, forward

    forward.clear_plans()
    calls = [make_qkv(2, 301, 301, 8, 2, head_dim, torch.bfloat16, packed=False)
             for _ in range(3)]
    outs = [flash_attn_func(*qkv, causal=causal, return_attn_probs=True)[:2] for qkv in calls]
    assert len(forward._kept) == 1 and len(attention._known) == 1
    graph_qkv = [t.clone() for t in calls[0]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = flash_attn_func(*graph_qkv, causal=causal)
    for t, fresh in zip(graph_qkv, calls[1]):
        t.copy_(fresh)
    graph.replay()
    outs.append((graph_out, outs[1][1]))
    for (q, k, v), (out, lse) in zip([*calls, calls[1]], outs):
        out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
        out_pt, lse_pt = attention_ref(q, k, v, causal=causal, upcast=False)
        assert_close_fa2(out, out_ref, out_pt, "out")
        assert_close_fa2(lse, lse_ref, lse_pt, "lse")
