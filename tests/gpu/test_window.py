"""Sliding-window (local) attention, FlashAttention-2's window_size=(left, right): query i sees key
j iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1 unbounded; causal
sets right to 0). Outputs and gradients against the fp32 reference on every family, varlen, the
KV cache, determinism and bad input."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.test_backward import assert_grads_close, make_dout, make_qkv
from tests.gpu.test_varlen import cu_seqlens

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (window_size, causal): a causal window, two-sided ones, one side unbounded, the diagonal only.
WINDOWS = [((16, 0), True), ((64, 32), False), ((-1, 40), False), ((100, -1), False),
           ((0, 0), False), ((200, 7), True)]
# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd sizes, more queries than keys (rows that see
# no key), GQA.
SHAPES = [(2, 239, 500, 8, 2), (1, 1023, 512, 8, 8), (2, 512, 512, 4, 1), (1, 1, 300, 4, 4)]


def window_id(case) -> str:
    (left, right), causal = case
    return f"w{left}_{right}{'_causal' if causal else ''}"


def shape_id(shape) -> str:
    return "b{}_q{}_k{}_h{}_hk{}".format(*shape)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("case", WINDOWS, ids=window_id)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, case, shape, each_family):
    window, causal = case
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                  return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window)
    out_pt, lse_pt = attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")
    dout = make_dout(out, non_contiguous=False)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_grads_close(grads, q, k, v, dout, causal, window_size=window)


def test_rows_outside_every_window_get_zero_and_minus_infinity():
    # 100 queries, 10 keys, aligned bottom-right: rows 0..89 lie before key 0, and a window of 3
    # keys to the left leaves rows 90-3.. only partly covered.
    q, k, v = make_qkv(1, 100, 10, 4, 4, 64, torch.bfloat16, False)
    out, lse, _ = flash_attn_func(q, k, v, window_size=(3, 0), return_attn_probs=True)
    assert torch.equal(out[:, :90], torch.zeros_like(out[:, :90]))
    assert torch.isneginf(lse[:, :, :90]).all() and torch.isfinite(lse[:, :, 90:]).all()
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][:, :90], torch.zeros_like(grads[0][:, :90]))


def test_a_window_wider_than_the_sequences_runs_the_dense_kernel(each_family):
    q, k, v = make_qkv(2, 300, 300, 4, 4, 128, torch.bfloat16, False)
    wide = flash_attn_func(q, k, v, window_size=(299, 299))
    assert torch.equal(wide, flash_attn_func(q, k, v))
    causal_wide = flash_attn_func(q, k, v, causal=True, window_size=(5000, 5000))
    assert torch.equal(causal_wide, flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_gradients_are_bit_identical(head_dim, each_family):
    q, k, v = make_qkv(2, 1000, 1200, 8, 2, head_dim, torch.bfloat16, False)
    dout = torch.randn_like(q)

    def grads():
        out = flash_attn_func(q, k, v, causal=True, window_size=(300, 0), deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    assert_grads_close(first, q, k, v, dout, True, window_size=(300, 0))


@pytest.mark.parametrize("case", WINDOWS, ids=window_id)
def test_varlen_sequences_each_see_their_own_window(case):
    window, causal = case
    lengths_q, lengths_k = [37, 0, 300, 129], [50, 20, 300, 1]
    heads, heads_kv, head_dim, dtype = 4, 2, 128, torch.bfloat16

    def packed(lengths, heads_):
        return torch.randn(sum(lengths), heads_, head_dim, device="cuda", dtype=dtype,
                           requires_grad=True)

    q, k, v = packed(lengths_q, heads), packed(lengths_k, heads_kv), packed(lengths_k, heads_kv)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens(lengths_q), cu_seqlens(lengths_k),
                                 max(lengths_q), max(lengths_k), causal=causal,
                                 window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    starts_q, starts_k = cu_seqlens(lengths_q).tolist(), cu_seqlens(lengths_k).tolist()
    for b in range(len(lengths_q)):
        rows = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b + 1])
        if rows.start == rows.stop:
            continue
        seq = [t[s].unsqueeze(0).detach().requires_grad_() for t, s in ((q, rows), (k, keys),
                                                                       (v, keys))]
        ref, _ = attention_ref(*seq, causal=causal, window_size=window)
        same_dtype, _ = attention_ref(*seq, causal=causal, window_size=window, upcast=False)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        d = dout[rows].unsqueeze(0)
        assert_grads_close((grads[0][rows].unsqueeze(0), grads[1][keys].unsqueeze(0),
                            grads[2][keys].unsqueeze(0)), *seq, d, causal, window_size=window)


@pytest.mark.parametrize("seqlen_q", [1, 4, 300])
@pytest.mark.parametrize("page_size", [None, 16, 256], ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("case", [((100, 0), True), ((40, 8), False)], ids=window_id)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kv_cache_attends_to_the_window(head_dim, case, page_size, seqlen_q):
    """Pages of 16 at head dim 64 run one token on the warps split across the keys
    (mma/decode_launch.cuh), the others on the warps across the rows."""
    from tests.gpu.test_kvcache import Cache

    window, causal = case
    batch, capacity, heads, heads_kv, dtype = 3, 1024, 8, 2, torch.bfloat16
    lengths = [seqlen_q, 500, capacity]
    cache = Cache(batch, capacity, heads_kv, head_dim, dtype, lengths, page_size)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                  block_table=cache.block_table, causal=causal,
                                  window_size=window)
    k_all, v_all = cache.logical(cache.k), cache.logical(cache.v)
    for b, length in enumerate(lengths):
        args = (q[b:b + 1], k_all[b:b + 1, :length], v_all[b:b + 1, :length])
        ref, _ = attention_ref(*args, causal=causal, window_size=window)
        same_dtype, _ = attention_ref(*args, causal=causal, window_size=window, upcast=False)
        assert_close_fa2(out[b:b + 1], ref, same_dtype, f"out of sequence {b}")


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1.5, 2), (3,), "wide"])
def test_bad_windows_name_the_argument(window):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.bfloat16, False)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=window)


def test_window_time_grows_with_the_window_not_the_sequence():
    """The key blocks outside the window are never read: at 8k, a window of 512 keys does about a
    seventh of causal attention's work (GPU-bound sizes, so launches do not hide it)."""
    q, k, v = (torch.randn(2, 8192, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))

    def milliseconds(**kwargs):
        for _ in range(3):
            flash_attn_func(q, k, v, causal=True, **kwargs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            flash_attn_func(q, k, v, causal=True, **kwargs)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 10

    full, windowed = milliseconds(), milliseconds(window_size=(512, 0))
    assert windowed < full / 3, (full, windowed)
