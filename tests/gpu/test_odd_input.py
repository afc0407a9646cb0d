"""Odd but valid calls get the right answer."""

from __future__ import annotations

import math

import pytest
import torch

from flashgen import flash_attn_func, scaled_dot_product_attention
from flashgen.reference import assert_close_fa2, attention_ref

pytestmark = pytest.mark.gpu


def check(q, k, v, causal=False, **kwargs):
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **kwargs)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_pt, lse_pt = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")
    return out, lse


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k", [(0, 16, 16), (2, 0, 16), (2, 16, 0),
                                                     (2, 0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_empty(batch, seqlen_q, seqlen_k, causal):
    q, k, v = randn(batch, seqlen_q, 4, 64), randn(batch, seqlen_k, 2, 64), randn(batch, seqlen_k, 2, 64)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)
    if out.numel():  # seqlen_k == 0: every row sees no key
        assert torch.all(out == 0) and torch.all(lse == -math.inf)


@pytest.mark.parametrize("causal", [False, True])
def test_single_row_single_head(causal):
    check(randn(1, 1, 1, 128), randn(1, 1, 1, 128), randn(1, 1, 1, 128), causal)


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    q, k, v = randn(2, 300, 4, 64), randn(2, 100, 4, 64), randn(2, 100, 4, 64)
    out, lse = check(q, k, v, causal=True)
    blind = 300 - 100  # rows 0..199 see no key under bottom-right alignment
    assert torch.all(out[:, :blind] == 0) and torch.all(lse[:, :, :blind] == -math.inf)
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, blind:]).all()


def test_batch_times_heads_beyond_grid_limit():
    # 70000 (batch, head) pairs: more than a grid's y or z dimension could hold.
    check(randn(35000, 3, 2, 32), randn(35000, 5, 2, 32), randn(35000, 5, 2, 32), causal=True)


def test_more_than_2_31_elements():
    # Each of q, k, v, out holds 16400 * 128 * 8 * 128 > 2^31 elements (4.3 GB in bf16).
    batch, seqlen, heads, head_dim = 16400, 128, 8, 128
    assert batch * seqlen * heads * head_dim > 2**31
    q, k, v = randn(batch, seqlen, heads, head_dim), randn(batch, seqlen, heads, head_dim), randn(
        batch, seqlen, heads, head_dim)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    for b in (0, batch // 2, batch - 1):  # the last batch lies past element 2^31
        sl = slice(b, b + 1)
        out_ref, lse_ref = attention_ref(q[sl], k[sl], v[sl], causal=True)
        out_pt, lse_pt = attention_ref(q[sl], k[sl], v[sl], causal=True, upcast=False)
        assert_close_fa2(out[sl], out_ref, out_pt, f"out[{b}]")
        assert_close_fa2(lse[sl], lse_ref, lse_pt, f"lse[{b}]")


def test_non_default_stream():
    q, k, v = randn(2, 512, 4, 64), randn(2, 512, 4, 64), randn(2, 512, 4, 64)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = flash_attn_func(q, k, v)
    stream.synchronize()
    assert_close_fa2(out, attention_ref(q, k, v)[0], attention_ref(q, k, v, upcast=False)[0])


def test_device_guard_switches_to_the_tensors_device(monkeypatch):
    """With one GPU, pretend another device is current: the launch must enter the tensors'
    device first (a second GPU needs a larger machine to test for real)."""
    from flashgen import host

    entered = []
    real_device = torch.cuda.device

    class RecordingDevice(real_device):
        def __enter__(self):
            entered.append(self.idx)
            return super().__enter__()

    monkeypatch.setattr(host, "_current_device", lambda: 1)
    monkeypatch.setattr(host.torch.cuda, "device", RecordingDevice)
    q, k, v = randn(1, 64, 2, 64), randn(1, 64, 2, 64), randn(1, 64, 2, 64)
    out = flash_attn_func(q, k, v)
    assert entered == [0]
    assert_close_fa2(out, attention_ref(q, k, v)[0], attention_ref(q, k, v, upcast=False)[0])


def test_unconfigured_head_dim_runs_zero_padded():
    check(randn(2, 100, 4, 72), randn(2, 130, 2, 72), randn(2, 130, 2, 72), causal=True)


def test_sdpa_unbatched_and_top_left_causal():
    import torch.nn.functional as F

    q, k, v = randn(4, 300, 64), randn(4, 100, 64), randn(4, 100, 64)
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    same = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close_fa2(out, ref, same)
