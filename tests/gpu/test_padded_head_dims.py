"""Every public function at head dims that run zero-padded to a configured one (40, 59 and 111
pad to 64, 64 and 128; 160 to 192), forward and backward where it has one, against the fp32
reference: FlashAttention-2 takes any head dim up to 256, and so must a call of flashgen."""

import math

import pytest
import torch

import flashgen
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HEAD_DIMS = [40, 59, 111, 160]
DTYPES = [torch.float16, torch.bfloat16]


def randn(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype).requires_grad_()


def check_training(out, inputs, reference_fn):
    """out against reference_fn(*inputs) in fp32 and in the inputs' dtype, then the gradients."""
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, dout)
    refs = []
    for upcast in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        ref = reference_fn(*leaves, upcast=upcast)
        refs.append((ref, torch.autograd.grad(ref, leaves, dout)))
    (ref, ref_grads), (same, same_grads) = refs
    assert_close_fa2(out, ref, same)
    for name, grad, r, s in zip(("dq", "dk", "dv"), grads, ref_grads, same_grads):
        assert_close_fa2(grad, r, s, name=name, eps=GRADIENT_EPS)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_flash_attn_func(dtype, head_dim, causal, poisoned_allocations):
    q = randn(2, 77, 4, head_dim, dtype=dtype)
    k, v = (randn(2, 130, 2, head_dim, dtype=dtype) for _ in range(2))
    out = flashgen.flash_attn_func(q, k, v, causal=causal)
    check_training(out, (q, k, v),
                   lambda q, k, v, upcast: attention_ref(q, k, v, causal, upcast=upcast)[0])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_flash_attn_varlen_func(dtype, head_dim, causal, poisoned_allocations):
    lengths_q, lengths_k = [37, 1, 100], [50, 9, 100]
    q = randn(sum(lengths_q), 4, head_dim, dtype=dtype)
    k, v = (randn(sum(lengths_k), 2, head_dim, dtype=dtype) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                               device="cuda") for n in (lengths_q, lengths_k))
    out, lse, _ = flashgen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q),
                                                  max(lengths_k), causal=causal,
                                                  return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lengths_q))

    def reference(q, k, v, upcast):
        outs, start_q, start_k = [], 0, 0
        for n_q, n_k in zip(lengths_q, lengths_k):
            o, _ = attention_ref(q[start_q:start_q + n_q][None], k[start_k:start_k + n_k][None],
                                 v[start_k:start_k + n_k][None], causal, upcast=upcast)
            outs.append(o[0])
            start_q, start_k = start_q + n_q, start_k + n_k
        return torch.cat(outs)

    check_training(out, (q, k, v), reference)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_scaled_dot_product_attention(dtype, head_dim, poisoned_allocations):
    q, k, v = (randn(2, 4, 65, head_dim, dtype=dtype) for _ in range(3))  # (batch, heads, seq, dim)
    out = flashgen.scaled_dot_product_attention(q, k, v, is_causal=True)

    def reference(q, k, v, upcast):
        o, _ = attention_ref(*(t.transpose(1, 2) for t in (q, k, v)), True, causal_offset=0,
                             upcast=upcast)
        return o.transpose(1, 2)

    check_training(out, (q, k, v), reference)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_packed_functions(dtype, head_dim, poisoned_allocations):
    qkv = randn(2, 70, 3, 4, head_dim, dtype=dtype)
    out = flashgen.flash_attn_qkvpacked_func(qkv, causal=True)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(2))
    unpacked = flashgen.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, unpacked)
    assert torch.equal(dqkv, torch.stack(torch.autograd.grad(unpacked, (q, k, v), dout), dim=2))

    q = randn(2, 70, 4, head_dim, dtype=dtype)
    kv = randn(2, 90, 2, 2, head_dim, dtype=dtype)
    assert torch.equal(flashgen.flash_attn_kvpacked_func(q, kv),
                       flashgen.flash_attn_func(q, *kv.unbind(2)))

    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device="cuda")
    rows = randn(70, 3, 4, head_dim, dtype=dtype)
    assert torch.equal(flashgen.flash_attn_varlen_qkvpacked_func(rows, cu, 40, causal=True),
                       flashgen.flash_attn_varlen_func(*rows.unbind(1), cu, cu, 40, 40,
                                                       causal=True))
    kv_rows = randn(70, 2, 2, head_dim, dtype=dtype)
    assert torch.equal(
        flashgen.flash_attn_varlen_kvpacked_func(rows[:, 0], kv_rows, cu, cu, 40, 40),
        flashgen.flash_attn_varlen_func(rows[:, 0], *kv_rows.unbind(1), cu, cu, 40, 40))


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_flash_attn_with_kvcache_appends_and_attends(dtype, head_dim, page_size,
                                                      poisoned_allocations):
    """Two new tokens appended at each sequence's length, then attended causally; the caches
    outside the appended rows stay as they were."""
    batch, capacity, heads, heads_kv, new = 2, 96, 4, 2, 2
    lengths = [30, 81]
    k_logical, v_logical = (torch.randn(batch, capacity, heads_kv, head_dim, device="cuda")
                            .to(dtype) for _ in range(2))
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, device="cuda").to(dtype)
                    for _ in range(2))
    q = torch.randn(batch, new, heads, head_dim, device="cuda").to(dtype)
    if page_size is None:
        k_cache, v_cache, block_table = k_logical.clone(), v_logical.clone(), None
    else:
        pages = capacity // page_size
        order = torch.randperm(batch * pages, device="cuda")
        block_table = order.view(batch, pages).to(torch.int32)
        k_cache, v_cache = (torch.empty(batch * pages, page_size, heads_kv, head_dim,
                                        device="cuda", dtype=dtype) for _ in range(2))
        for cache, logical in ((k_cache, k_logical), (v_cache, v_logical)):
            cache[order] = logical.view(batch * pages, page_size, heads_kv, head_dim)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flashgen.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                cache_seqlens=seqlens, block_table=block_table,
                                                causal=True, return_softmax_lse=True)
    for b, length in enumerate(lengths):
        k_logical[b, length:length + new] = k_new[b]
        v_logical[b, length:length + new] = v_new[b]
    if page_size is None:
        assert torch.equal(k_cache, k_logical) and torch.equal(v_cache, v_logical)
    else:
        pages = capacity // page_size
        logical_k = k_cache[block_table.long().flatten()].view(batch, capacity, heads_kv,
                                                               head_dim)
        assert torch.equal(logical_k, k_logical)
    for b, length in enumerate(lengths):
        keys = length + new
        args = (q[b:b + 1], k_logical[b:b + 1, :keys], v_logical[b:b + 1, :keys], True)
        ref, ref_lse = attention_ref(*args)
        same, _ = attention_ref(*args, upcast=False)
        assert_close_fa2(out[b:b + 1], ref, same)
        assert_close_fa2(lse[b:b + 1], ref_lse, ref_lse, name="lse", eps=1e-4)
    assert not math.isnan(out.float().sum().item())
