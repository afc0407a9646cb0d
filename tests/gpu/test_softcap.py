"""Soft capping, FlashAttention-2's softcap: each scaled score s becomes softcap * tanh(s /
softcap) (Gemma-2, Grok), on kernels compiled with the softcap score modifier. Outputs and
gradients against the fp32 reference on every family, with masks, windows and varlen."""

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
SHAPES = [(2, 239, 500, 8, 2), (1, 1023, 512, 8, 8), (2, 512, 512, 4, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (True, (100, 0))], ids=["full", "causal", "window"])
@pytest.mark.parametrize("softcap", [5.0, 30.0])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, softcap, causal, window,
                                                   shape, each_family):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    # Scores large enough that the cap bends them: softcap 5 saturates most of them.
    q = (q.detach() * 3).requires_grad_()
    kwargs = dict(causal=causal, window_size=window, softcap=softcap)
    assert_attention_matches_reference(q, k, v, kwargs, **kwargs)
    mask = "window" if window != (-1, -1) else "causal" if causal else "none"
    spec = forward.kernel_for(q.device, "bf16" if dtype == torch.bfloat16 else "fp16", head_dim,
                              mask, batch * heads, seqlen_q, score_mod="softcap")
    assert spec.score_mod == "softcap"


def test_varlen_sequences_are_capped_alike():
    lengths = [37, 300, 129]
    heads, head_dim, dtype = 4, 128, torch.bfloat16
    total = sum(lengths)
    q, k, v = (3 * torch.randn(total, heads, head_dim, device="cuda", dtype=dtype)
               for _ in range(3))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = cu_seqlens(lengths)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                 softcap=20.0)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    starts = cu.tolist()
    for b in range(len(lengths)):
        rows = slice(starts[b], starts[b + 1])
        seq = [t[rows].unsqueeze(0).detach().requires_grad_() for t in (q, k, v)]
        ref, _ = attention_ref(*seq, causal=True, softcap=20.0)
        same_dtype, _ = attention_ref(*seq, causal=True, softcap=20.0, upcast=False)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        assert_grads_close(tuple(g[rows].unsqueeze(0) for g in grads), *seq,
                           dout[rows].unsqueeze(0), True, softcap=20.0)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_gradients_are_bit_identical(head_dim, each_family):
    q, k, v = make_qkv(2, 700, 700, 8, 2, head_dim, torch.bfloat16, False)
    dout = torch.randn_like(q)

    def grads():
        out = flash_attn_func(q, k, v, causal=True, softcap=30.0, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    assert backward.kernel_for(q.device, "bf16", head_dim, "causal",
                               score_mod="softcap").score_mod == "softcap"


@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("new_tokens", [1, 4, 300], ids=lambda n: f"new{n}")
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kvcache_decode_and_chunked_prefill_are_capped(head_dim, page_size, new_tokens,
                                                       num_splits):
    """The decode kernels (one or a few new tokens, split or not) and, from 256 new tokens with
    num_splits=0, the forward that reads the cache."""
    from tests.gpu.test_kvcache import Cache, reference

    batch, capacity, dtype = 3, 704, torch.bfloat16
    lengths = [capacity, 333, new_tokens]
    cache = Cache(batch, capacity, 2, head_dim, dtype, lengths, page_size)
    q = 3 * torch.randn(batch, new_tokens, 8, head_dim, device="cuda").to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                       block_table=cache.block_table, causal=True, softcap=10.0,
                                       num_splits=num_splits, return_softmax_lse=True)
    ref, ref_lse, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v),
                                         lengths, True, softcap=10.0)
    assert_close_fa2(out, ref, same_dtype)
    assert_close_fa2(lse, ref_lse, ref_lse, name="lse", eps=1e-4)
    assert decode.kernel_for(q.device, "bf16", head_dim, True, new_tokens, group=4,
                             score_mod="softcap").score_mod == "softcap"


@pytest.mark.parametrize("softcap", [-1.0, float("inf")])
def test_bad_softcap_names_the_argument(softcap):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.bfloat16, False)
    with pytest.raises(ValueError, match="softcap"):
        flash_attn_func(q, k, v, softcap=softcap)


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1))],
                         ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_softcap_with_alibi_caps_then_biases(dtype, head_dim, causal, window, each_family):
    """FlashAttention-2 takes both: the cap, then ALiBi's bias (the softcap_alibi kernels)."""
    from tests.gpu.test_alibi import slopes

    batch, seqlen_q, seqlen_k, heads, heads_kv = SHAPES[0]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    q = (q.detach() * 3).requires_grad_()
    kwargs = dict(causal=causal, window_size=window, softcap=20.0,
                  alibi_slopes=slopes(batch, heads, per_sequence=True))
    assert_attention_matches_reference(q, k, v, kwargs, **kwargs)
    mask = "causal" if causal else "none"
    dtype_name = "bf16" if dtype == torch.bfloat16 else "fp16"
    assert forward.kernel_for(q.device, dtype_name, head_dim, mask, batch * heads, seqlen_q,
                              score_mod="softcap_alibi").score_mod == "softcap_alibi"


@pytest.mark.parametrize("new_tokens", [1, 4])
def test_kvcache_decode_caps_then_biases(new_tokens):
    from tests.gpu.test_alibi import slopes
    from tests.gpu.test_kvcache import Cache, reference

    batch, capacity, head_dim, dtype = 3, 704, 128, torch.bfloat16
    lengths = [capacity, 333, new_tokens]
    cache = Cache(batch, capacity, 2, head_dim, dtype, lengths, 16)
    q = 3 * torch.randn(batch, new_tokens, 8, head_dim, device="cuda").to(dtype)
    alibi = slopes(batch, 8, per_sequence=False)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                  block_table=cache.block_table, causal=True, softcap=10.0,
                                  alibi_slopes=alibi)
    ref, _, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v), lengths,
                                   True, softcap=10.0, alibi_slopes=alibi)
    assert_close_fa2(out, ref, same_dtype)
