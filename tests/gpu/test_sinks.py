"""Attention sinks (s_aux, gpt-oss's; learnable_sink, FlashAttention-4's name): one logit per
query head that joins every row's softmax denominator and adds no value. Output, lse and every
gradient, the sinks' own among them, against the fp32 reference on both families, with masks,
windows, GQA, rows that see no key and variable-length batches."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func, flash_attn_varlen_func
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref
from tests.gpu.test_backward import make_qkv
from tests.gpu.test_varlen import cu_seqlens

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd sizes, GQA, and more queries than keys
# (bottom-right causal: the first 200 rows see no key).
SHAPES = [(2, 239, 500, 8, 2), (1, 300, 100, 4, 4)]


def sinks_for(heads):
    return (torch.randn(heads, device="cuda") * 2).requires_grad_()


def assert_matches_reference(out, lse, grads, q, k, v, sinks, dout, **kwargs):
    """out, lse and the gradients of (q, k, v, sinks) against attention_ref with the sinks, by
    FlashAttention-2's rule (PyTorch's own error: the same reference in the inputs' dtype)."""
    leaves = {}
    results = {}
    for upcast in (True, False):
        leaves[upcast] = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
        ref_out, ref_lse = attention_ref(*leaves[upcast][:3], sinks=leaves[upcast][3],
                                         upcast=upcast, **kwargs)
        results[upcast] = (ref_out, ref_lse, torch.autograd.grad(ref_out, leaves[upcast], dout))
    (out_ref, lse_ref, grads_ref), (out_pt, _, grads_pt) = results[True], results[False]
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_ref, "lse", eps=1e-4)
    for name, grad, ref, pt in zip(("dq", "dk", "dv", "dsinks"), grads, grads_ref, grads_pt):
        assert_close_fa2(grad, ref, pt, name, eps=gradient_eps(name, ref, q.dtype))


def gradient_eps(name, reference, dtype) -> float:
    """The rule's eps: the gradients' floor plus two roundings of the inputs' dtype relative to
    the gradient's size. With a sink, dS = P * (dP - D) keeps the error of D = rowsum(dout *
    out), which FlashAttention's backward reads from the output rounded to that dtype, where
    PyTorch's reference has none (then the gradient's own rounding): a row with one key (P near
    1) and dsinks (a sum of P * D over a head's rows) show it."""
    return 2 * torch.finfo(dtype).eps * reference.abs().max().item() + GRADIENT_EPS


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (64, 32))], ids=["full", "causal", "window"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, causal, window, shape,
                                                   each_family):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    sinks = sinks_for(heads)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, s_aux=sinks,
                                  return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)
    assert_matches_reference(out, lse, grads, q, k, v, sinks, dout, causal=causal,
                             window_size=window)


def test_a_row_that_sees_no_key_gives_the_sink_everything(each_family):
    q, k, v = make_qkv(1, 300, 100, 4, 4, 128, torch.bfloat16, False)
    sinks = sinks_for(4)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, learnable_sink=sinks,
                                  return_attn_probs=True)
    hidden = slice(0, 200)  # bottom-right causal: rows before 200 see no key
    assert torch.equal(out[:, hidden], torch.zeros_like(out[:, hidden]))
    torch.testing.assert_close(lse[0, :, hidden], sinks.detach()[:, None].expand(-1, 200))


def test_without_sinks_nothing_changes(each_family):
    """A sink of -inf takes no probability: the call without sinks, bit for bit."""
    q, k, v = make_qkv(2, 239, 500, 8, 2, 128, torch.bfloat16, False)
    plain = flash_attn_func(q, k, v, causal=True)
    sunk = flash_attn_func(q, k, v, causal=True, s_aux=torch.full((8,), -torch.inf,
                                                                  device="cuda"))
    assert torch.equal(plain, sunk)


def test_varlen_sequences_each_get_their_heads_sinks(each_family):
    lengths = [37, 300, 129, 1]
    heads, heads_kv, head_dim, dtype = 8, 2, 128, torch.bfloat16
    total = sum(lengths)
    q = torch.randn(total, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(total, heads_kv, head_dim, device="cuda", dtype=dtype,
                        requires_grad=True) for _ in range(2))
    sinks = sinks_for(heads)
    cu = cu_seqlens(lengths)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                         causal=True, s_aux=sinks, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)
    starts = cu.tolist()
    dsinks = {True: torch.zeros_like(sinks), False: torch.zeros_like(sinks)}
    for b in range(len(lengths)):
        rows = slice(starts[b], starts[b + 1])
        seq_grads = {}
        for upcast in (True, False):
            leaves = [t[rows].unsqueeze(0).detach().requires_grad_() for t in (q, k, v)]
            leaves.append(sinks.detach().clone().requires_grad_())
            ref, ref_lse = attention_ref(*leaves[:3], causal=True, sinks=leaves[3],
                                         upcast=upcast)
            seq_grads[upcast] = (ref, ref_lse,
                                 torch.autograd.grad(ref, leaves, dout[rows].unsqueeze(0)))
            dsinks[upcast] += seq_grads[upcast][2][3]
        (ref, ref_lse, ref_grads), (same_dtype, _, pt_grads) = seq_grads[True], seq_grads[False]
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        assert_close_fa2(lse[:, rows], ref_lse[0], ref_lse[0], f"lse of sequence {b}", eps=1e-4)
        for name, grad, expected, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
            assert_close_fa2(grad[rows].unsqueeze(0), expected, pt, f"{name} of sequence {b}",
                             eps=gradient_eps(name, expected, dtype))
    assert_close_fa2(grads[3], dsinks[True], dsinks[False], "dsinks",
                     eps=gradient_eps("dsinks", dsinks[True], dtype))


@pytest.mark.parametrize("change, error, message", [
    (lambda h: dict(s_aux=torch.zeros(h, device="cuda", dtype=torch.bfloat16)), TypeError,
     "float32"),
    (lambda h: dict(s_aux=torch.zeros(h + 1, device="cuda")), ValueError, r"shape \(nheads,\)"),
    (lambda h: dict(s_aux=torch.zeros(h)), ValueError, "is on cpu"),
    (lambda h: dict(s_aux=[0.0] * h), TypeError, "torch.Tensor"),
    (lambda h: dict(s_aux=torch.zeros(h, device="cuda"),
                    learnable_sink=torch.zeros(h, device="cuda")), ValueError, "pass one"),
], ids=["dtype", "shape", "device", "list", "both_names"])
def test_bad_sinks_name_the_argument(change, error, message):
    q, k, v = make_qkv(1, 16, 16, 4, 4, 64, torch.bfloat16, False)
    with pytest.raises(error, match=message):
        flash_attn_func(q, k, v, **change(4))
