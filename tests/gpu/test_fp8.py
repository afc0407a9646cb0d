"""The e4m3 forward (flashgen/fp8.py, the hopper family's fwd_fp8 kernels) against an fp32
reference on the dequantised inputs, outputs poisoned: every configured head dim, causal, window,
GQA, odd lengths, descales per (batch, KV head) and broadcast, inputs with outlier channels, and
the bf16 / fp16 outputs. The error budget is FlashAttention-2's rule with PyTorch's own route in
the same precision: the same attention in fp32 but for P rounded to e4m3 before PV, as any FP8
PV must (attention_ref's p_dtype); the bf16 kernel's error on the same values is printed beside
it."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func
from flashgen.reference import attention_ref, max_error

pytestmark = [
    pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations"),
    pytest.mark.skipif(not torch.cuda.is_available()
                       or torch.cuda.get_device_capability() != (9, 0),
                       reason="the e4m3 forward runs on sm_90"),
]

E4M3 = torch.float8_e4m3fn


def per_head(descale, heads: int):
    """(batch, heads_kv) factors -> broadcast over (batch, seq, heads, dim), each group of
    heads // heads_kv query heads taking its KV head's."""
    return descale.repeat_interleave(heads // descale.shape[1], dim=1)[:, None, :, None]


def quantised(shape, heads_kv: int, outliers: bool = False):
    """(e4m3 tensor, its fp32 descales (batch, heads_kv)): random values, every fourth channel
    20x larger with outliers, scaled per (batch, KV head) to e4m3's range."""
    x = torch.randn(shape, device="cuda")
    if outliers:
        x[..., ::4] *= 20
    batch, seqlen, heads, dim = shape
    amax = x.view(batch, seqlen, heads_kv, heads // heads_kv, dim).abs().amax(dim=(1, 3, 4))
    descale = (amax / 448.0).clamp_min(1e-12)
    return (x / per_head(descale, heads)).to(E4M3), descale


def dequantised(x, descale):
    return x.float() * per_head(descale, x.shape[2])


CASES = [
    # batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window_size
    (2, 128, 128, 4, 4, 128, False, (-1, -1)),
    (1, 1000, 1000, 8, 2, 128, True, (-1, -1)),
    (2, 257, 300, 6, 3, 64, False, (-1, -1)),
    (1, 513, 513, 4, 1, 64, True, (-1, -1)),
    (1, 700, 700, 4, 4, 256, True, (-1, -1)),
    (2, 300, 450, 4, 2, 256, False, (-1, -1)),
    (1, 1024, 1024, 4, 2, 128, False, (128, 0)),
    (2, 77, 203, 2, 2, 96, False, (-1, -1)),  # runs zero-padded on head dim 128
]


@pytest.mark.parametrize("outliers", [False, True], ids=["random", "outliers"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:6])) + (
    "-causal" if c[6] else "") + ("-window" if c[7] != (-1, -1) else ""))
def test_e4m3_forward_matches_the_reference_within_the_e4m3_route(case, outliers):
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window = case
    q, q_descale = quantised((batch, seqlen_q, heads, head_dim), heads_kv, outliers)
    k, k_descale = quantised((batch, seqlen_k, heads_kv, head_dim), heads_kv, outliers)
    v, v_descale = quantised((batch, seqlen_k, heads_kv, head_dim), heads_kv, outliers)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                  q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == (batch, seqlen_q, heads, head_dim)
    qf, kf, vf = (dequantised(x, d) for x, d in ((q, q_descale), (k, k_descale),
                                                 (v, v_descale)))
    reference, reference_lse = attention_ref(qf, kf, vf, causal=causal, window_size=window)
    route, _ = attention_ref(qf, kf, vf, causal=causal, window_size=window, p_dtype=E4M3)
    error = max_error(out, reference)
    budget = 2 * max_error(route, reference) + 1e-3 * reference.abs().max().item()
    # the bf16 kernel on the same values (e4m3 values are exact in bf16)
    bf16_error = max_error(flash_attn_func(*(x.to(torch.bfloat16) for x in (qf, kf, vf)),
                                           causal=causal, window_size=window), reference)
    print(f"e4m3 error {error:.3e} (budget {budget:.3e}), bf16 kernel {bf16_error:.3e}")
    assert error <= budget, f"e4m3 max error {error:.3e} > {budget:.3e} (bf16: {bf16_error:.3e})"
    assert max_error(lse, reference_lse) <= 1e-3 * max(1.0, reference_lse.abs().max().item())


def test_fp16_output_and_no_descales():
    q, k, v = (torch.randn(2, 200, 4, 64, device="cuda").to(E4M3) for _ in range(3))
    out = flash_attn_func(q, k, v, out_dtype=torch.float16)
    assert out.dtype == torch.float16
    reference, _ = attention_ref(q.float(), k.float(), v.float())
    route, _ = attention_ref(q.float(), k.float(), v.float(), p_dtype=E4M3)
    assert max_error(out, reference) <= 2 * max_error(route, reference) + 1e-3


def test_strided_inputs_and_broadcast_descales():
    qkv = torch.randn(1, 300, 12, 128, device="cuda").to(E4M3)  # packed: strided views
    q, k, v = qkv.split([4, 4, 4], dim=2)
    descale = torch.full((1, 1), 0.5, device="cuda")
    out = flash_attn_func(q, k, v, causal=True, q_descale=descale, k_descale=descale,
                          v_descale=descale)
    reference, _ = attention_ref(q.float() * 0.5, k.float() * 0.5, v.float() * 0.5,
                                 causal=True)
    route, _ = attention_ref(q.float() * 0.5, k.float() * 0.5, v.float() * 0.5, causal=True,
                             p_dtype=E4M3)
    assert max_error(out, reference) <= 2 * max_error(route, reference) + 1e-3


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_a_packed_e4m3_batch_matches_each_sequence_alone(head_dim, causal):
    """flash_attn_varlen_func in e4m3: each sequence (lengths not multiples of 16, one empty)
    against the fp32 reference of its own dequantised rows, within the e4m3 route's budget."""
    from flashgen import flash_attn_varlen_func

    lengths_q, lengths_k = [37, 1, 300, 0, 129], [50, 17, 300, 5, 200]
    heads, heads_kv = 4, 2
    q = torch.randn(sum(lengths_q), heads, head_dim, device="cuda").to(E4M3)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, device="cuda").to(E4M3)
            for _ in range(2))
    v_descale = torch.rand(len(lengths_q), heads_kv, device="cuda") + 0.5
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                               device="cuda") for n in (lengths_q, lengths_k))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                      causal=causal, v_descale=v_descale,
                                      return_softmax_lse=True)
    for b, (n_q, n_k) in enumerate(zip(lengths_q, lengths_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        qf, kf = q[rows].float()[None], k[keys].float()[None]
        vf = v[keys].float()[None] * per_head(v_descale[b:b + 1], heads_kv)
        reference, reference_lse = attention_ref(qf, kf, vf, causal=causal)
        route, _ = attention_ref(qf, kf, vf, causal=causal, p_dtype=E4M3)
        assert max_error(out[rows][None], reference) <= (
            2 * max_error(route, reference) + 1e-3 * max(1.0, reference.abs().max().item())), b
        assert max_error(lse[:, rows], reference_lse[0]) <= 1e-3 * max(
            1.0, reference_lse.abs().max().item()), b
