"""Gradients of flash_attn_func and the SDPA drop-in against the fp32 reference's, by autograd,
over the default config's specialisation matrix. FlashAttention-2's rule: error at most twice
PyTorch's own error in the same dtype. Uninitialised allocations are poisoned with NaN
(tests/gpu/conftest.py) to catch gradient elements the kernels do not write."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgen import flash_attn_func, scaled_dot_product_attention
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref
from tests.gpu.cases import matrix_cases, sdpa_cases

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

GRAD_NAMES = ("dq", "dk", "dv")


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed):
    """q, k, v that require grad (views of one leaf when packed)."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)

    if packed and seqlen_q == seqlen_k:
        qkv = randn(batch, seqlen_q, heads + 2 * heads_kv, head_dim)
        return qkv.split([heads, heads_kv, heads_kv], dim=2)
    return (randn(batch, seqlen_q, heads, head_dim), randn(batch, seqlen_k, heads_kv, head_dim),
            randn(batch, seqlen_k, heads_kv, head_dim))


def make_dout(like: torch.Tensor, non_contiguous: bool) -> torch.Tensor:
    """Random, never zero: a zero dout would hide a wrong backward."""
    if not non_contiguous:
        return torch.randn_like(like)
    wide = torch.randn(*like.shape[:-1], 2 * like.shape[-1], device="cuda", dtype=like.dtype)
    return wide[..., like.shape[-1]:]


def reference_grads(q, k, v, dout, causal, upcast, **kwargs):
    """dq, dk, dv of flashgen.reference.attention_ref (fp32 with upcast, else in the dtype)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, causal=causal, upcast=upcast, **kwargs)
    return torch.autograd.grad(out, leaves, dout)


def assert_grads_close(grads, q, k, v, dout, causal, **kwargs):
    expected = reference_grads(q, k, v, dout, causal, upcast=True, **kwargs)
    same_dtype = reference_grads(q, k, v, dout, causal, upcast=False, **kwargs)
    for name, grad, ref, pt in zip(GRAD_NAMES, grads, expected, same_dtype):
        assert grad.shape == ref.shape and grad.dtype == ref.dtype, name
        assert_close_fa2(grad, ref, pt, name, eps=GRADIENT_EPS)


def assert_attention_matches_reference(q, k, v, reference_kwargs: dict, **call):
    """flash_attn_func(q, k, v, **call)'s output, lse and gradients against attention_ref with
    reference_kwargs (the same mask and score modifier in Python), by FlashAttention-2's rule."""
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **call)
    out_ref, lse_ref = attention_ref(q, k, v, **reference_kwargs)
    out_pt, lse_pt = attention_ref(q, k, v, upcast=False, **reference_kwargs)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")
    dout = make_dout(out, non_contiguous=False)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_grads_close(grads, q, k, v, dout, **reference_kwargs)


@matrix_cases
def test_flash_attn_func_grads(dtype, head_dim, causal, shape):
    batch, seqlen_q, seqlen_k, heads, heads_kv, packed = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed)
    out = flash_attn_func(q, k, v, causal=causal)
    dout = make_dout(out, non_contiguous=packed)
    if packed:
        assert not q.is_contiguous() and not dout.is_contiguous()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_grads_close(grads, q, k, v, dout, causal)


@sdpa_cases
def test_sdpa_drop_in_grads(dtype, head_dim, is_causal, shape):
    """Against PyTorch's SDPA, causal aligned top-left: in fp32 (math backend) the reference, in
    the input dtype (the backend PyTorch picks) its own error."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    gqa = heads != heads_kv
    sizes = ((heads, seqlen_q), (heads_kv, seqlen_k), (heads_kv, seqlen_k))
    query, key, value = (torch.randn(batch, h, s, head_dim, device="cuda", dtype=dtype,
                                     requires_grad=True) for h, s in sizes)
    out = scaled_dot_product_attention(query, key, value, is_causal=is_causal, enable_gqa=gqa)
    assert out.shape == query.shape and out.is_contiguous()
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (query, key, value), dout)

    def torch_grads(cast):
        leaves = [cast(t.detach()).requires_grad_() for t in (query, key, value)]
        ref = F.scaled_dot_product_attention(*leaves, is_causal=is_causal, enable_gqa=gqa)
        return torch.autograd.grad(ref, leaves, cast(dout))

    with sdpa_kernel(SDPBackend.MATH):
        expected = torch_grads(lambda t: t.float())
    same_dtype = torch_grads(lambda t: t)
    for name, grad, ref, pt in zip(GRAD_NAMES, grads, expected, same_dtype):
        assert_close_fa2(grad, ref, pt, name, eps=GRADIENT_EPS)


@contextlib.contextmanager
def deterministic_algorithms():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("heads_kv,causal", [(8, False), (2, True)], ids=["mha_full", "gqa_causal"])
@pytest.mark.parametrize("function", ["flash_attn_func", "sdpa"])
def test_deterministic_backward_is_bit_reproducible(function, heads_kv, causal):
    """Big enough (2 x 1024 x 8 heads x hd128) that accumulation order would differ between runs
    if the kernels used atomics. SDPA takes determinism from torch.use_deterministic_algorithms."""
    q, k, v = make_qkv(2, 1024, 1024, 8, heads_kv, 128, torch.bfloat16, packed=False)
    dout = torch.randn_like(q)

    def attention():
        if function == "sdpa":
            return scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                is_causal=causal, enable_gqa=True).transpose(1, 2)
        return flash_attn_func(q, k, v, causal=causal, deterministic=True)

    mode = deterministic_algorithms() if function == "sdpa" else contextlib.nullcontext()
    with mode:
        runs = [torch.autograd.grad(attention(), (q, k, v), dout) for _ in range(3)]
    for run in runs[1:]:
        for name, grad, first in zip(GRAD_NAMES, run, runs[0]):
            assert torch.equal(grad, first), f"{name} differs between runs"
    # seqlen_q == seqlen_k: top-left and bottom-right causal agree
    assert_grads_close(runs[0], q, k, v, dout, causal)


def test_rows_that_see_no_key_get_zero_dq():
    q, k, v = make_qkv(2, 300, 100, 4, 2, 64, torch.bfloat16, packed=False)
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    blind = 300 - 100  # rows 0..199 see no key under bottom-right alignment
    assert torch.all(dq[:, :blind] == 0)
    assert all(torch.isfinite(grad).all() for grad in (dq, dk, dv))
    assert_grads_close((dq, dk, dv), q, k, v, dout, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unconfigured_head_dim_grads_run_zero_padded(causal):
    q, k, v = make_qkv(2, 100, 130, 4, 2, 80, torch.bfloat16, packed=False)
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    assert_grads_close(torch.autograd.grad(out, (q, k, v), dout), q, k, v, dout, causal)


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k", [(0, 16, 16), (2, 0, 16), (2, 16, 0)])
def test_empty_inputs_get_zero_grads(batch, seqlen_q, seqlen_k):
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, 64, torch.bfloat16, packed=False)
    out = flash_attn_func(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for grad, t in zip(grads, (q, k, v)):
        assert grad.shape == t.shape and torch.all(grad == 0)


def test_expanded_dout_from_a_sum():
    """out.sum().backward() hands the backward a dout with every stride 0."""
    q, k, v = make_qkv(2, 129, 129, 4, 4, 64, torch.bfloat16, packed=False)
    flash_attn_func(q, k, v, causal=True).sum().backward()
    dout = torch.ones(q.shape, device="cuda", dtype=q.dtype)
    assert_grads_close((q.grad, k.grad, v.grad), q, k, v, dout, causal=True)


def test_sdpa_output_can_be_modified_in_place_like_pytorchs():
    """The output is not a view made inside the op, which autograd would forbid changing in place
    at all. As for PyTorch's SDPA, whose backward also reads its output, a backward through the
    changed output then fails."""
    query, key, value = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16,
                                     requires_grad=True) for _ in range(3))
    for attention in (scaled_dot_product_attention, F.scaled_dot_product_attention):
        out = attention(query, key, value)
        out.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_lse_does_not_require_grad():
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.bfloat16, packed=False)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_training_step_repeated_at_one_shape_runs_its_kept_launches_on_each_steps_tensors(
        head_dim, causal, deterministic):
    """The second and later steps of a shape launch the first's kept forward and backward
    params (flashgen/forward.py, backward.py) with their own tensors: fresh inputs and dout
    each step, each step's gradients its own."""
    from flashgen import backward, forward

    forward.clear_plans()
    backward.clear_plans()
    for _ in range(3):
        q, k, v = make_qkv(2, 301, 301, 8, 2, head_dim, torch.bfloat16, packed=False)
        out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
        dout = make_dout(out, non_contiguous=False)
        out.backward(dout)
        assert_grads_close((q.grad, k.grad, v.grad), q, k, v, dout, causal)
    assert len(forward._kept) == len(backward._kept) == 1
