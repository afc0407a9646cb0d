"""Wrong calls get a clear exception before any kernel launch, naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func, scaled_dot_product_attention

pytestmark = pytest.mark.gpu


def qkv(b=2, sq=64, sk=64, h=4, hk=4, d=64, dtype=torch.bfloat16, device="cuda"):
    return (torch.randn(b, sq, h, d, device=device, dtype=dtype),
            torch.randn(b, sk, hk, d, device=device, dtype=dtype),
            torch.randn(b, sk, hk, d, device=device, dtype=dtype))


def replace(tensors, index, value):
    tensors = list(tensors)
    tensors[index] = value
    return tensors


CASES = {
    "cpu_tensor": (lambda: replace(qkv(), 1, torch.randn(2, 64, 4, 64, dtype=torch.bfloat16)),
                   {}, ValueError, "k is on cpu"),
    "mixed_dtypes": (lambda: replace(qkv(), 2, torch.randn(2, 64, 4, 64, device="cuda",
                                                           dtype=torch.float16)),
                     {}, TypeError, "must have one dtype"),
    "fp32": (lambda: qkv(dtype=torch.float32), {}, TypeError, "torch.float16 or torch.bfloat16"),
    "fp64": (lambda: qkv(dtype=torch.float64), {}, TypeError, "torch.float16 or torch.bfloat16"),
    "integer": (lambda: [t.to(torch.int32) for t in qkv()], {}, TypeError, "int32"),
    "rank3": (lambda: [t[0] for t in qkv()], {}, ValueError, "4 dimensions"),
    "batch_mismatch": (lambda: replace(qkv(), 0, qkv(b=3)[0]), {}, ValueError, "batch"),
    "head_dim_mismatch": (lambda: replace(qkv(), 0, qkv(d=128)[0]), {}, ValueError, "head dim"),
    "kv_seqlen_mismatch": (lambda: replace(qkv(), 2, qkv(sk=65)[2]), {}, ValueError,
                           "same shape"),
    "heads_not_multiple": (lambda: qkv(h=6, hk=4), {}, ValueError, "multiple"),
    "head_dim_too_large": (lambda: qkv(d=264), {}, ValueError, "largest head dim"),
    "head_dim_not_contiguous": (lambda: [t.transpose(2, 3).contiguous().transpose(2, 3)
                                         for t in qkv()], {}, ValueError, "contiguous"),
    "scale_nan": (qkv, {"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    "scale_inf": (qkv, {"softmax_scale": float("inf")}, ValueError, "softmax_scale"),
    "scale_zero": (qkv, {"softmax_scale": 0.0}, ValueError, "softmax_scale"),
    "scale_negative": (qkv, {"softmax_scale": -0.1}, ValueError, "softmax_scale"),
    "dropout_one": (qkv, {"dropout_p": 1.0}, ValueError, r"dropout_p must be a number in \[0, 1"),
    "window_negative": (qkv, {"window_size": (-2, 0)}, ValueError, "window_size"),
    "window_not_a_pair": (qkv, {"window_size": 8}, ValueError, "window_size"),
    "softcap_negative": (qkv, {"softcap": -30.0}, ValueError, "softcap"),
    "alibi_on_cpu": (qkv, {"alibi_slopes": torch.ones(4)}, ValueError, "alibi_slopes is on cpu"),
    "not_a_tensor": (lambda: replace(qkv(), 0, [[1.0]]), {}, TypeError, "torch.Tensor"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_attn_func_rejects(case):
    make, kwargs, error, message = CASES[case]
    torch.cuda.synchronize()
    with pytest.raises(error, match=message):
        flash_attn_func(*make(), **kwargs)
    torch.cuda.synchronize()  # no asynchronous CUDA error was left behind


def test_unconfigured_head_dim_lists_configured_and_shows_the_config():
    q, k, v = qkv(d=264)
    with pytest.raises(ValueError) as info:
        flash_attn_func(q, k, v)
    assert "configured head dims" in str(info.value)


SDPA_CASES = {
    "attn_mask_on_cpu": ({"attn_mask": torch.ones(64, 64, dtype=torch.bool)}, ValueError,
                         "attn_mask is on cpu"),
    "dropout_negative": ({"dropout_p": -0.5}, ValueError, r"dropout_p must be a number in \[0,"),
    "gqa_without_flag": ({"_heads_kv": 2}, ValueError, "enable_gqa"),
    "scale_negative": ({"scale": -1.0}, ValueError, "softmax_scale"),
}


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_rejects(case):
    kwargs, error, message = SDPA_CASES[case]
    kwargs = dict(kwargs)
    heads_kv = kwargs.pop("_heads_kv", 4)
    q = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, heads_kv, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(q, k, k.clone(), **kwargs)


def test_misaligned_input_is_copied_and_correct():
    from flashgen.reference import assert_close_fa2, attention_ref

    base = torch.randn(2 * 64 * 4 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    q = base[1:].view(2, 64, 4, 64)  # 2-byte offset: not 16-byte aligned
    k, v = qkv()[1:]
    out = flash_attn_func(q, k, v)
    assert_close_fa2(out, attention_ref(q, k, v)[0], attention_ref(q, k, v, upcast=False)[0])
