"""The GPU tests' poison reaches every output: with tests/poison.py installed (the
poisoned_allocations fixture's allocators) and kernel launches that write nothing, every tensor
that flash_attn_func, flash_attn_varlen_func, scaled_dot_product_attention and
flash_attn_with_kvcache return, and every gradient they give, is all NaN. Runs the real Python
path on CPU tensors that report cuda:0 (tests/kernel_mock.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flashgen import (flash_attn_func, flash_attn_varlen_func,  # noqa: E402
                      flash_attn_with_kvcache, scaled_dot_product_attention)
from tests import kernel_mock  # noqa: E402
from tests.poison import poison_allocations  # noqa: E402


@pytest.fixture
def kernels_that_write_nothing(monkeypatch):
    """tests/kernel_mock.py's launches, which write nothing, under the poison: the binding
    entries launched, in order, as they come."""
    launches = kernel_mock.install(monkeypatch).launches
    poison_allocations(monkeypatch)
    return launches


def entries(launches) -> list[str]:
    return [entry for entry, _ in launches]


def assert_all_nan(**tensors):
    for name, t in tensors.items():
        assert t.is_floating_point() and t.numel() > 0, name
        assert torch.isnan(t).all(), f"{name}: {int((~torch.isnan(t)).sum())} elements not NaN"


def qkv(*shapes, requires_grad=True):
    return [torch.randn(shape, dtype=torch.bfloat16, requires_grad=requires_grad)
            for shape in shapes]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_funcs_out_lse_and_gradients_are_poisoned(kernels_that_write_nothing,
                                                             causal):
    q, k, v = qkv((2, 40, 4, 64), (2, 56, 2, 64), (2, 56, 2, 64))
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    out.backward(torch.randn_like(out))  # randn: written, not poisoned
    assert entries(kernels_that_write_nothing) == ["fwd", "bwd"]
    assert_all_nan(out=out, lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)


def test_an_inference_call_repeated_at_one_shape_is_poisoned_too(kernels_that_write_nothing):
    """The second call is a known one (flashgen/attention.py): no checks, the kept launch."""
    q, k, v = qkv((2, 40, 4, 64), (2, 56, 2, 64), (2, 56, 2, 64), requires_grad=False)
    for _ in range(2):
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert entries(kernels_that_write_nothing) == ["fwd", "fwd"]
    assert_all_nan(out=out, lse=lse)


def test_a_training_step_repeated_at_one_shape_is_poisoned_too(kernels_that_write_nothing):
    """The second step launches the first's kept params (flashgen/forward.py, backward.py)."""
    for _ in range(2):
        q, k, v = qkv((2, 40, 4, 64), (2, 56, 2, 64), (2, 56, 2, 64))
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
        out.backward(torch.randn_like(out))
    assert entries(kernels_that_write_nothing) == ["fwd", "bwd"] * 2
    assert_all_nan(out=out, lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)


def test_flash_attn_varlen_funcs_out_lse_and_gradients_are_poisoned(kernels_that_write_nothing):
    lengths_q, lengths_k = [30, 0, 17], [25, 40, 9]
    cu_seqlens_q, cu_seqlens_k = (torch.tensor([0, *torch.tensor(n).cumsum(0)], dtype=torch.int32)
                                  for n in (lengths_q, lengths_k))
    q, k, v = qkv((sum(lengths_q), 4, 64), (sum(lengths_k), 2, 64), (sum(lengths_k), 2, 64))
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max(lengths_q),
                                         max(lengths_k), causal=True, return_attn_probs=True)
    out.backward(torch.randn_like(out))
    assert entries(kernels_that_write_nothing) == ["fwd", "bwd"]
    assert_all_nan(out=out, lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)


def test_sdpas_out_and_gradients_are_poisoned(kernels_that_write_nothing):
    q, k, v = qkv((2, 4, 40, 64), (2, 4, 56, 64), (2, 4, 56, 64))
    out = scaled_dot_product_attention(q, k, v)
    out.backward(torch.randn_like(out))
    assert entries(kernels_that_write_nothing) == ["fwd", "bwd"]
    assert_all_nan(out=out, dq=q.grad, dk=k.grad, dv=v.grad)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_flash_attn_with_kvcaches_out_and_lse_are_poisoned(kernels_that_write_nothing,
                                                           num_splits, paged):
    """num_splits 3: the splits' fp32 workspaces, then a combine that writes out and lse. The
    second call of each launches the first's plan directly (kvcache.py's known calls), with and
    without lse."""
    batch, new = 2, 3
    cache_shape = (6, 16, 2, 64) if paged else (batch, 48, 2, 64)
    k_cache, v_cache = (torch.zeros(cache_shape, dtype=torch.bfloat16) for _ in range(2))
    q, k, v = qkv((batch, new, 4, 64), (batch, new, 2, 64), (batch, new, 2, 64),
                  requires_grad=False)
    block_table = (torch.arange(6, dtype=torch.int32).view(batch, 3) if paged else None)
    cache_seqlens = torch.tensor([5, 20], dtype=torch.int32)
    for lse_wanted in (True, False):
        for _ in range(2):
            result = flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                             cache_seqlens=cache_seqlens,
                                             block_table=block_table, causal=True,
                                             num_splits=num_splits,
                                             return_softmax_lse=lse_wanted)
            out, lse = result if lse_wanted else (result, None)
            assert_all_nan(out=out, **({"lse": lse} if lse_wanted else {}))
    assert entries(kernels_that_write_nothing) == ["decode"] * 4
