"""ALiBi, FlashAttention-2's alibi_slopes: the scaled score of query i and key j gets
-slope * |i + seqlen_k - seqlen_q - j|, one slope per head (or per sequence and head), on kernels
compiled with the alibi score modifier. Outputs and gradients against the fp32 reference on every
family, with masks, windows, GQA and varlen."""

from __future__ import annotations

import pytest
import torch

from flashgen import (backward, decode, flash_attn_func, flash_attn_varlen_func,
                      flash_attn_with_kvcache, forward)
from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.test_backward import (assert_attention_matches_reference, assert_grads_close,
                                     make_qkv)
from tests.gpu.test_varlen import cu_seqlens

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd sizes, more queries than keys, GQA.
SHAPES = [(2, 239, 500, 8, 2), (1, 1023, 512, 8, 8)]


def slopes(batch: int, heads: int, per_sequence: bool) -> torch.Tensor:
    """ALiBi's geometric slopes 2^(-8 i / heads), varied per sequence when per_sequence."""
    base = torch.pow(2.0, -8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
    if not per_sequence:
        return base
    return base * torch.linspace(0.5, 1.5, batch, device="cuda").view(-1, 1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (100, 50))],
                         ids=["full", "causal", "window"])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["heads", "batch_heads"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, per_sequence, causal,
                                                   window, shape, each_family):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    kwargs = dict(causal=causal, window_size=window,
                  alibi_slopes=slopes(batch, heads, per_sequence))
    assert_attention_matches_reference(q, k, v, kwargs, **kwargs)
    mask = "window" if window != (-1, -1) else "causal" if causal else "none"
    dtype_name = "bf16" if dtype == torch.bfloat16 else "fp16"
    assert forward.kernel_for(q.device, dtype_name, head_dim, mask, batch * heads, seqlen_q,
                              score_mod="alibi").score_mod == "alibi"


def test_varlen_sequences_align_their_bias_bottom_right():
    lengths_q, lengths_k = [37, 300, 129], [50, 300, 400]
    heads, head_dim, dtype = 4, 128, torch.bfloat16
    q = torch.randn(sum(lengths_q), heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lengths_k), heads, head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    alibi = slopes(len(lengths_q), heads, per_sequence=True)
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                 causal=True, alibi_slopes=alibi)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    sq, sk = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lengths_q)):
        rows, keys = slice(sq[b], sq[b + 1]), slice(sk[b], sk[b + 1])
        seq = [t[r].unsqueeze(0).detach().requires_grad_() for t, r in zip((q, k, v),
                                                                          (rows, keys, keys))]
        kwargs = dict(causal=True, alibi_slopes=alibi[b])
        ref, _ = attention_ref(*seq, **kwargs)
        same_dtype, _ = attention_ref(*seq, upcast=False, **kwargs)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        assert_grads_close((grads[0][rows].unsqueeze(0), grads[1][keys].unsqueeze(0),
                            grads[2][keys].unsqueeze(0)), *seq, dout[rows].unsqueeze(0),
                           **kwargs)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_gradients_are_bit_identical(head_dim, each_family):
    q, k, v = make_qkv(2, 700, 700, 8, 2, head_dim, torch.bfloat16, False)
    dout = torch.randn_like(q)
    alibi = slopes(2, 8, per_sequence=False)

    def grads():
        out = flash_attn_func(q, k, v, causal=True, alibi_slopes=alibi, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    assert backward.kernel_for(q.device, "bf16", head_dim, "causal",
                               score_mod="alibi").score_mod == "alibi"


@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("new_tokens", [1, 4, 300], ids=lambda n: f"new{n}")
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["heads", "batch_heads"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kvcache_decode_and_chunked_prefill_are_biased(head_dim, per_sequence, page_size,
                                                       new_tokens, num_splits):
    """The decode kernels (whose rows are the heads of a KV head, each with its own slope) and,
    from 256 new tokens with num_splits=0, the forward that reads the cache; the distance is
    aligned bottom-right to each sequence's keys."""
    from tests.gpu.test_kvcache import Cache, reference

    batch, capacity, heads, dtype = 3, 704, 8, torch.bfloat16
    lengths = [capacity, 333, new_tokens]
    cache = Cache(batch, capacity, 2, head_dim, dtype, lengths, page_size)
    q = torch.randn(batch, new_tokens, heads, head_dim, device="cuda").to(dtype)
    alibi = slopes(batch, heads, per_sequence)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                       block_table=cache.block_table, causal=True,
                                       alibi_slopes=alibi, num_splits=num_splits,
                                       return_softmax_lse=True)
    keys, values = cache.logical(cache.k), cache.logical(cache.v)
    for b, length in enumerate(lengths):
        ref, ref_lse, same_dtype = reference(q[b:b + 1], keys[b:b + 1], values[b:b + 1], [length],
                                             True, alibi_slopes=alibi[b] if per_sequence else alibi)
        assert_close_fa2(out[b:b + 1], ref, same_dtype, f"out of sequence {b}")
        assert_close_fa2(lse[b:b + 1], ref_lse, ref_lse, name=f"lse of sequence {b}", eps=1e-4)
    assert decode.kernel_for(q.device, "bf16", head_dim, True, new_tokens, group=4,
                             score_mod="alibi").score_mod == "alibi"


@pytest.mark.parametrize("bad, error, message", [
    (torch.ones(3), ValueError, r"alibi_slopes must have shape \(nheads,\) = \(4,\)"),
    (torch.ones(2, 4, dtype=torch.float16), TypeError, "alibi_slopes must be float32"),
    ([0.5] * 4, TypeError, "alibi_slopes must be a torch.Tensor"),
])
def test_bad_slopes_name_the_argument(bad, error, message):
    q, k, v = make_qkv(2, 16, 16, 4, 4, 64, torch.bfloat16, False)
    if isinstance(bad, torch.Tensor):
        bad = bad.cuda()
    with pytest.raises(error, match=message):
        flash_attn_func(q, k, v, alibi_slopes=bad)


def test_slopes_on_another_device_are_refused():
    q, k, v = make_qkv(1, 16, 16, 4, 4, 64, torch.bfloat16, False)
    with pytest.raises(ValueError, match="alibi_slopes is on cpu"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(4))
