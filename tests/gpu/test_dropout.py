"""Dropout on the attention probabilities (dropout_p): FlashAttention-2's semantics, each
probability dropped with probability p and the kept ones scaled by 1 / (1 - p), the mask drawn
by Philox from a key that torch's CUDA generator supplies (common/dropout.cuh).

Forwards and backwards run on each family (hopper, mma; the hopper backward where it has the
head dim and the batch is not varlen): the mask depends on positions only, so a forward and a
backward of different families agree, which the varlen and forward_family cases exercise. The
mask of a call is known exactly: after torch.manual_seed(s) the call's key is what
flashgen.validate.draw_dropout_seed draws first, and flashgen.reference.dropout_keep computes the
mask from the key. Outputs
and gradients are checked against the fp32 reference under that mask; the mask read back from
the kernel itself (v = identity) is checked against it and for its keep rate; the output's mean
over many masks against attention without dropout."""

from __future__ import annotations

import pytest
import torch

from codegen.arch import arch_for_capability
from flashgen import (backward, flash_attn_func, flash_attn_varlen_func, forward, registry,
                      scaled_dot_product_attention, validate)
from flashgen.reference import assert_close_fa2, attention_ref, dropout_keep
from tests.gpu.test_backward import (assert_attention_matches_reference, assert_grads_close,
                                     make_qkv)
from tests.gpu.test_varlen import cu_seqlens

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd sizes, more queries than keys, GQA.
SHAPES = [(2, 239, 500, 8, 2), (1, 1023, 512, 4, 4), (3, 128, 128, 2, 1)]


def mask_of_next_call(seed: int, dropout_p: float, batch: int, heads: int, seqlen_q: int,
                      seqlen_k: int) -> torch.Tensor:
    """Seeds torch so that the next flashgen call draws a known key, and returns its mask."""
    torch.manual_seed(seed)
    key = validate.draw_dropout_seed("cuda").item()
    torch.manual_seed(seed)
    return dropout_keep(key, dropout_p, batch, heads, seqlen_q, seqlen_k, device="cuda")


def kernel_mask(out: torch.Tensor) -> torch.Tensor:
    """The kept probabilities of a call with v = identity (seqlen_k = head dim keys): out[b, i,
    h, j] = P_ij / (1 - p) where kept, exactly 0 where dropped (P > 0 everywhere). (b, h, i, j)."""
    return (out != 0).permute(0, 2, 1, 3)


def identity_values(batch: int, keys: int, heads: int, dtype) -> torch.Tensor:
    eye = torch.eye(keys, device="cuda", dtype=dtype)
    return eye.view(1, keys, 1, keys).expand(batch, keys, heads, keys).contiguous()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (100, 50))],
                         ids=["full", "causal", "window"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, causal, window, shape,
                                                   each_family):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, False)
    p = 0.17
    keep = mask_of_next_call(11, p, batch, heads, seqlen_q, seqlen_k)
    kwargs = dict(causal=causal, window_size=window)
    assert_attention_matches_reference(q, k, v, dict(kwargs, dropout_p=p, dropout_keep=keep),
                                       dropout_p=p, **kwargs)
    mask = "window" if window != (-1, -1) else "causal" if causal else "none"
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    forward_spec = forward.kernel_for(q.device, name, head_dim, mask, batch * heads, seqlen_q,
                                      dropout=True)
    backward_spec = backward.kernel_for(q.device, name, head_dim, mask, dropout=True)
    assert forward_spec.dropout and forward_spec.family == each_family
    plain = registry.candidates(arch_for_capability(*torch.cuda.get_device_capability()), "bwd",
                                name, head_dim, mask)[0].spec
    assert backward_spec.dropout and backward_spec.family == plain.family


@pytest.mark.parametrize("score", [{"softcap": 20.0}, {"alibi_slopes": "slopes"}],
                         ids=["softcap", "alibi"])
def test_score_modifiers_combine_with_dropout(score):
    q, k, v = make_qkv(2, 300, 300, 4, 2, 128, torch.bfloat16, False)
    if "alibi_slopes" in score:
        score = {"alibi_slopes": torch.rand(4, device="cuda")}
    keep = mask_of_next_call(5, 0.3, 2, 4, 300, 300)
    assert_attention_matches_reference(q, k, v, dict(score, causal=True, dropout_p=0.3,
                                                     dropout_keep=keep),
                                       dropout_p=0.3, causal=True, **score)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_kernels_mask_is_the_reference_mask_and_keeps_one_minus_p(p, forward_family):
    batch, seqlen_q, heads, keys = 2, 1000, 8, 64
    q = torch.randn(batch, seqlen_q, heads, keys, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, keys, heads, keys, device="cuda", dtype=torch.float16) * 0.1
    v = identity_values(batch, keys, heads, torch.float16)
    keep = mask_of_next_call(3, p, batch, heads, seqlen_q, keys)
    forward_mask = kernel_mask(flash_attn_func(q, k, v, dropout_p=p))
    assert torch.equal(forward_mask, keep)
    # 1,024,000 draws: the keep rate's standard deviation is at most 0.0005
    assert abs(forward_mask.float().mean().item() - (1 - p)) < 0.0025


def test_the_backward_drops_what_the_forward_dropped(forward_family):
    """One query row and keys that are the identity: dV's row j is (Z * P)_j / (1 - p) * dO, so
    it is exactly zero iff the forward's output column j was."""
    heads, keys = 8, 64
    q = torch.randn(1, 1, heads, keys, device="cuda", dtype=torch.float16)
    k = torch.randn(1, keys, heads, keys, device="cuda", dtype=torch.float16) * 0.1
    v = identity_values(1, keys, heads, torch.float16).requires_grad_()
    torch.manual_seed(9)
    out = flash_attn_func(q, k, v, dropout_p=0.5)
    (dv,) = torch.autograd.grad(out, (v,), torch.ones_like(out))
    dropped_forward = (out[0, 0] == 0)                   # (heads, keys)
    dropped_backward = (dv[0] == 0).all(dim=-1).T        # (heads, keys)
    assert dropped_forward.any() and not dropped_forward.all()
    assert torch.equal(dropped_forward, dropped_backward)


def test_same_seed_is_bit_identical_and_new_draws_differ():
    q, k, v = make_qkv(2, 500, 500, 4, 4, 128, torch.bfloat16, False)
    dout = torch.randn(2, 500, 4, 128, device="cuda", dtype=torch.bfloat16)

    def run(seed):
        if seed is not None:
            torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    first, again = run(1), run(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = run(2)
    assert not torch.equal(first[0], other[0])
    successive = run(None), run(None)  # no reseeding: each call draws a new key
    assert not torch.equal(successive[0][0], successive[1][0])


def test_the_mean_over_masks_is_attention_without_dropout():
    """E[Z / (1 - p)] = 1, so dropout's outputs average to the plain output: over n masks, each
    element's mean sits within a few standard errors of it."""
    q, k, v = (torch.randn(1, 96, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    plain = flash_attn_func(q, k, v).float()
    n = 400
    outs = torch.stack([flash_attn_func(q, k, v, dropout_p=0.3).float() for _ in range(n)])
    standard_error = outs.std(dim=0) / n ** 0.5
    z = (outs.mean(dim=0) - plain) / standard_error.clamp_min(1e-4)
    # 12,288 elements: mean z^2 of a standard normal is 1 (+- 0.013 if independent; elements of
    # a row share its mask); |z| > 5.5 has odds of 4e-8 per element
    assert 0.85 < z.square().mean().item() < 1.15
    assert z.abs().max().item() < 5.5


def test_varlen_sequences_draw_the_masks_of_their_positions():
    lengths_q, lengths_k = [37, 300, 129], [50, 300, 400]
    heads, head_dim, dtype, p = 4, 64, torch.bfloat16, 0.25
    q = torch.randn(sum(lengths_q), heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lengths_k), heads, head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    keep = mask_of_next_call(4, p, len(lengths_q), heads, max(lengths_q), max(lengths_k))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                 dropout_p=p, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    sq, sk = cu_q.tolist(), cu_k.tolist()
    for b, (len_q, len_k) in enumerate(zip(lengths_q, lengths_k)):
        rows, keys = slice(sq[b], sq[b + 1]), slice(sk[b], sk[b + 1])
        seq = [t[r].unsqueeze(0).detach().requires_grad_() for t, r in zip((q, k, v),
                                                                          (rows, keys, keys))]
        kwargs = dict(causal=True, dropout_p=p, dropout_keep=keep[b:b + 1, :, :len_q, :len_k])
        ref, _ = attention_ref(*seq, **kwargs)
        same_dtype, _ = attention_ref(*seq, upcast=False, **kwargs)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        assert_grads_close((grads[0][rows].unsqueeze(0), grads[1][keys].unsqueeze(0),
                            grads[2][keys].unsqueeze(0)), *seq, dout[rows].unsqueeze(0),
                           **kwargs)


@pytest.mark.parametrize("attn_mask", [False, True], ids=["is_causal", "attn_mask"])
def test_sdpa_dropout(attn_mask):
    batch, heads, seqlen, head_dim, p = 2, 4, 333, 64, 0.4
    query, key, value = (torch.randn(batch, heads, seqlen, head_dim, device="cuda",
                                     dtype=torch.float16, requires_grad=True) for _ in range(3))
    bias = torch.randn(batch, 1, seqlen, seqlen, device="cuda") if attn_mask else None
    keep = mask_of_next_call(8, p, batch, heads, seqlen, seqlen)
    out = scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=p,
                                       is_causal=not attn_mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (query, key, value), dout)
    views = [t.transpose(1, 2) for t in (query, key, value)]
    kwargs = dict(causal=not attn_mask, causal_offset=0, score_bias=bias, dropout_p=p,
                  dropout_keep=keep)
    ref, _ = attention_ref(*views, **kwargs)
    same_dtype, _ = attention_ref(*views, upcast=False, **kwargs)
    assert_close_fa2(out.transpose(1, 2), ref, same_dtype)
    assert_grads_close([g.transpose(1, 2) for g in grads], *views, dout.transpose(1, 2),
                       **kwargs)


def test_cuda_graph_replays_draw_new_masks():
    batch, seqlen_q, heads, keys, p = 1, 256, 4, 64, 0.5
    q = torch.randn(batch, seqlen_q, heads, keys, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, keys, heads, keys, device="cuda", dtype=torch.float16) * 0.1
    v = identity_values(batch, keys, heads, torch.float16)
    flash_attn_func(q, k, v, dropout_p=p)  # compiled and planned before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v, dropout_p=p)
    masks = []
    for _ in range(3):
        graph.replay()
        masks.append(kernel_mask(out).clone())
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    for mask in masks:
        assert abs(mask.float().mean().item() - (1 - p)) < 0.02


def test_a_forced_hopper_family_still_runs_dropout_on_the_mma_family(monkeypatch):
    monkeypatch.setenv("FLASHGEN_FAMILY", "hopper")
    forward.clear_plans()
    backward.clear_plans()
    try:
        q, k, v = make_qkv(1, 200, 200, 2, 2, 128, torch.bfloat16, False)
        keep = mask_of_next_call(6, 0.2, 1, 2, 200, 200)
        assert_attention_matches_reference(q, k, v, dict(causal=True, dropout_p=0.2,
                                                         dropout_keep=keep),
                                           dropout_p=0.2, causal=True)
    finally:
        forward.clear_plans()
        backward.clear_plans()


def test_torch_compile_fullgraph_draws_reproducible_masks():
    """Under torch.compile the key is drawn in the graph (inductor's own RNG stream, so compiled
    and eager masks differ, as for any PyTorch random op); a seed still reproduces it, and the
    kernels' mask keeps 1 - p."""
    batch, seqlen_q, heads, keys, p = 2, 512, 4, 64, 0.3
    q = torch.randn(batch, seqlen_q, heads, keys, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k = (torch.randn(batch, keys, heads, keys, device="cuda", dtype=torch.bfloat16) * 0.1)
    v = identity_values(batch, keys, heads, torch.bfloat16)

    @torch.compile(fullgraph=True)
    def attention(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=p)

    torch.manual_seed(21)
    first = attention(q, k, v)
    torch.manual_seed(21)
    again = attention(q, k, v)
    assert torch.equal(first, again)
    assert abs(kernel_mask(first).float().mean().item() - (1 - p)) < 0.01
    (dq,) = torch.autograd.grad(first, (q,), torch.randn_like(first))
    assert dq.isfinite().all()
