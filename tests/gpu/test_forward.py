"""flash_attn_func and the SDPA drop-in against the fp32 reference, over the default config's
specialisation matrix. Outputs are poisoned (NaN) before each call to catch unwritten elements
(tests/gpu/conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashgen.reference import assert_close_fa2, attention_ref

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 64, 96, 128, 192, 256]
# (batch, seqlen_q, seqlen_k, heads, heads_kv, packed): packed slices q, k, v out of one qkv
# tensor, so they are non-contiguous.
SHAPES = [
    (1, 1, 1, 8, 8, False),
    (2, 17, 17, 8, 2, True),
    (1, 113, 203, 8, 1, False),
    (3, 128, 128, 8, 8, True),
    (2, 239, 113, 8, 2, False),
    (1, 512, 1023, 8, 1, False),
    (4, 1023, 512, 8, 8, False),
    (1, 2048, 2048, 8, 2, True),
    (2, 1, 239, 8, 8, False),
    (1, 239, 1, 8, 2, False),
]


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


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}{}".format(
    *s[:5], "_packed" if s[5] else ""))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
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


SDPA_SHAPES = [(2, 17, 17, 8, 8), (1, 239, 113, 8, 2), (2, 113, 239, 8, 1), (1, 1024, 1024, 8, 8)]


@pytest.mark.parametrize("shape", SDPA_SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
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
