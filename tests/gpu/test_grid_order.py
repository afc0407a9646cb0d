"""The grids' order (flashgen/schedule.py, block_order.cuh) decides which block runs
when, never what it computes: under causal masking every order gives the same bits (the backward's dQ
only where it is deterministic: atomics add in any order), and they match the fp32 reference.
Split key blocks sum their pieces in fp32, in any order: their gradients match the reference.
Outputs are poisoned (NaN) before each call."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_func, forward
from flashgen import schedule
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations", "mma_forward")]

# Ranks per round: one rank (longest first across the grid), two, three (a short last round),
# and one round (each (batch, head) after another).
ORDERS = [1, 2, 3, 10**6]
# The backward's sorted tail, in blocks: none ((batch, head)-major), part of the grid, all of it.
SORTED_TAILS = [0, 5, 10**6]
# (batch, seqlen_q, seqlen_k, heads, heads_kv)
SHAPES = [(2, 1000, 1000, 8, 2), (3, 777, 1500, 4, 4), (1, 1500, 640, 6, 1)]


@pytest.fixture
def grid_order(monkeypatch):
    """Sets the causal ranks per round (until the test ends); the forward's cached choices are
    dropped either side."""
    def use(ranks_per_round: int):
        monkeypatch.setattr(schedule, "CAUSAL_RANKS_PER_ROUND", ranks_per_round)
        forward.clear_plans()

    yield use
    forward.clear_plans()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"hd{d}")
def test_every_grid_order_gives_the_same_bits(grid_order, head_dim, shape):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    results = []
    for ranks_per_round in ORDERS:
        grid_order(ranks_per_round)
        results.append(flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2])
    (out, lse), *others = results
    for other_out, other_lse in others:
        assert torch.equal(other_out, out) and torch.equal(other_lse, lse)
    out_ref, lse_ref = attention_ref(q, k, v, causal=True)
    out_pt, lse_pt = attention_ref(q, k, v, causal=True, upcast=False)
    assert_close_fa2(out, out_ref, out_pt, "out")
    assert_close_fa2(lse, lse_ref, lse_pt, "lse")


@pytest.fixture
def backward_order(monkeypatch):
    """Sets the backward's sorted tail (until the test ends)."""
    def use(tail_blocks: int):
        monkeypatch.setattr(schedule, "sorted_tail_blocks", lambda *_: tail_blocks)

    return use


def checked_gradients(use, choices, head_dim, shape, causal, deterministic=False) -> list:
    """The gradients of one forward's output, one backward per choice (use(choice) first), each
    checked against the fp32 reference."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    dout = torch.randn_like(q)
    out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    results = []
    for choice in choices:
        use(choice)
        results.append(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    expected, same_dtype = (torch.autograd.grad(attention_ref(*leaves, causal=causal,
                                                              upcast=upcast)[0], leaves, dout)
                            for upcast in (True, False))
    for grads in results:
        for name, grad, ref, pt in zip(("dq", "dk", "dv"), grads, expected, same_dtype):
            assert_close_fa2(grad, ref, pt, name, eps=GRADIENT_EPS)
    return results


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "deterministic"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"hd{d}")
def test_every_backward_order_gives_the_same_gradients(backward_order, head_dim, shape,
                                                       deterministic):
    (dq, dk, dv), *others = checked_gradients(backward_order, SORTED_TAILS, head_dim, shape,
                                              True, deterministic)
    for other_dq, other_dk, other_dv in others:  # each key block writes its own dK and dV
        assert torch.equal(other_dk, dk) and torch.equal(other_dv, dv)
        assert torch.equal(other_dq, dq) or not deterministic


# The dK/dV grid's split blocks (split_blocks, splits): none; all in 3 pieces; the last 5 in 2;
# all in 40 pieces, more than a block has steps (empty pieces add zeros).
SPLITS = [(0, 1), (10**6, 3), (5, 2), (10**6, 40)]


@pytest.fixture
def backward_split(monkeypatch):
    """Sets the dK/dV grid's split, (split_blocks, splits) capped at the grid's blocks (until
    the test ends)."""
    def use(split: tuple[int, int]):
        split_blocks, splits = split
        monkeypatch.setattr(schedule, "split_tail",
                            lambda _uneven, _deterministic, blocks, _steps, _sm_count:
                            (min(split_blocks, blocks), splits))

    return use


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"hd{d}")
def test_split_key_blocks_give_the_reference_gradients(backward_split, head_dim, shape, causal):
    checked_gradients(backward_split, SPLITS, head_dim, shape, causal)
