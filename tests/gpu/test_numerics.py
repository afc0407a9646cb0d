"""Numerics at the edges: inf/NaN propagate like the fp32 reference, big logits don't overflow,
extreme softmax scales stay accurate."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func
from flashgen.reference import assert_close_fa2, attention_ref

pytestmark = pytest.mark.gpu


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_propagate_like_the_reference(dtype, where, value):
    q, k, v = randn(1, 200, 2, 64, dtype=dtype), randn(1, 150, 2, 64, dtype=dtype), randn(
        1, 150, 2, 64, dtype=dtype)
    tensor = {"q": q, "k": k, "v": v}[where]
    tensor[0, 37, 1, 5] = value
    out = flash_attn_func(q, k, v)
    out_ref, _ = attention_ref(q, k, v)
    out_pt, _ = attention_ref(q, k, v, upcast=False)
    nan_ref = torch.isnan(out_ref)
    assert nan_ref.any() or torch.isinf(out_ref).any(), "the test must exercise a non-finite"
    assert torch.equal(torch.isnan(out), nan_ref), "NaN pattern differs from the reference"
    finite = ~nan_ref
    assert_close_fa2(out[finite], out_ref[finite], out_pt[finite])


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_do_not_overflow(causal):
    q, k, v = randn(2, 257, 4, 128) * 100, randn(2, 257, 4, 128) * 100, randn(2, 257, 4, 128)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_pt, lse_pt = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_fa2(out, out_ref, out_pt)
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")


@pytest.mark.parametrize("scale", [1e-3, 10.0])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_extreme_softmax_scale(scale, head_dim):
    q, k, v = randn(2, 300, 4, head_dim), randn(2, 333, 4, head_dim), randn(2, 333, 4, head_dim)
    out, lse, _ = flash_attn_func(q, k, v, softmax_scale=scale, return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, softmax_scale=scale)
    out_pt, lse_pt = attention_ref(q, k, v, softmax_scale=scale, upcast=False)
    assert_close_fa2(out, out_ref, out_pt)
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")
